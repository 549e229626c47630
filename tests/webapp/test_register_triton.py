"""manage.py register_triton records a Triton server by name, and updates it when run again."""
import pytest
from django.core.management import call_command

from webapp.models import TritonServer


@pytest.mark.django_db
def test_it_registers_a_server_and_updates_it_by_name(tmp_path):
    call_command("register_triton", "--name", "local", "--http-url", "http://127.0.0.1:8100", "--grpc-url",
                 "127.0.0.1:8101", "--metrics-url", "http://127.0.0.1:8102", "--repository", str(tmp_path))
    call_command("register_triton", "--name", "local", "--http-url", "http://127.0.0.1:8200", "--repository",
                 str(tmp_path), "--external", "--gpu")
    server = TritonServer.objects.get()
    assert (server.http_url, server.kind, server.instance_kind, server.model_repository) == (
        "http://127.0.0.1:8200", "external", "gpu", str(tmp_path.resolve()))
