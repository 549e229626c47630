"""manage.py register_triton: record (or update) a Triton server the workbench deploys to.

    python manage.py register_triton --name local --http-url http://127.0.0.1:8100 --grpc-url 127.0.0.1:8101 \
        --metrics-url http://127.0.0.1:8102 --repository var/triton-models [--external] [--gpu]

The run command registers the local Triton it starts this way; staff may also add servers in the admin or the API.
"""
from pathlib import Path

from django.core.management.base import BaseCommand

from webapp.models import TritonServer


class Command(BaseCommand):
    help = "Record or update a Triton server (by name) that deployments can use."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--http-url", required=True)
        parser.add_argument("--grpc-url", default="")
        parser.add_argument("--metrics-url", default="")
        parser.add_argument("--repository", required=True, help="the server's model repository folder")
        parser.add_argument("--external", action="store_true", help="run elsewhere; only connected to")
        parser.add_argument("--gpu", action="store_true", help="it runs model instances on GPUs (KIND_GPU)")

    def handle(self, *args, **options):
        server, created = TritonServer.objects.update_or_create(name=options["name"], defaults={
            "kind": TritonServer.Kind.EXTERNAL if options["external"] else TritonServer.Kind.MANAGED,
            "http_url": options["http_url"], "grpc_url": options["grpc_url"],
            "metrics_url": options["metrics_url"],
            "instance_kind": TritonServer.InstanceKind.GPU if options["gpu"] else TritonServer.InstanceKind.CPU,
            "model_repository": str(Path(options["repository"]).resolve())})
        self.stdout.write(f"{'registered' if created else 'updated'} Triton server {server.name!r} "
                          f"({server.http_url}, repository {server.model_repository})")
