"""A Triton server's readiness, kept by the reconcile pass: the deploy form and the admin say what is true of the
session's real Triton without anyone having asked its status endpoint."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from tests.webapp import serving
from webapp.models import TritonServer
from webapp.pages.deploy import DeployForm
from workers import tasks

pytestmark = pytest.mark.django_db


def test_it_records_each_servers_readiness_on_every_reconcile_pass(triton):
    an_hour_ago = timezone.now() - timedelta(hours=1)
    live = TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                       metrics_url=triton.metrics_url, model_repository=str(triton.repository))
    with serving.refusing_port() as port:
        gone = TritonServer.objects.create(name="gone", http_url=f"http://127.0.0.1:{port}", is_ready=True,
                                           last_seen_at=an_hour_ago, model_repository="/nowhere")
        before = timezone.now()
        tasks.reconcile()
    live.refresh_from_db()
    gone.refresh_from_db()
    assert live.is_ready and before <= live.last_seen_at <= timezone.now()
    assert not gone.is_ready and gone.last_seen_at == an_hour_ago  # seen last an hour ago, and not since
    offered = DeployForm(user=User.objects.create_user("deployer")).fields["server"]
    assert offered.label_from_instance(live) == "local (ready, cpu)"
