"""Deploying on Triton (workers.deploying): the task run in this process for its refusals and redeliveries, and one
deployment end to end through the REST API, the real Celery worker and the session's real Triton."""
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.webapp import serving
from tests.xdist_groups import data_roots
from webapp import models
from workers import deploying

Status = models.Deployment.Status


@pytest.fixture
def owner(db):
    return User.objects.create_user("deployer")


@pytest.fixture
def roots(settings, tmp_path_factory):
    """Every temporary folder of the test run is a data root, as for the session's worker (tests.worker_fixtures),
    so that the checkpoints the tests import may be exported."""
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": data_roots(tmp_path_factory)}


@pytest.fixture
def port():
    with serving.refusing_port() as port:
        yield port


@pytest.fixture
def unreachable(db, port, tmp_path):
    return models.TritonServer.objects.create(name="nowhere", http_url=f"http://127.0.0.1:{port}",
                                              grpc_url=f"127.0.0.1:{port}", model_repository=str(tmp_path / "models"))


@pytest.fixture
def small(owner, roots, tmp_path):
    return serving.imported(owner, serving.checkpoint_folder(tmp_path / "small"))


@pytest.mark.parametrize("status", [Status.READY, Status.FAILED, Status.UNLOADED])
def test_it_leaves_a_settled_deployment_as_it_is_when_the_task_comes_again(owner, small, unreachable, status):
    settled = serving.deployment(owner, small, unreachable, status=status, status_message="as it was")
    assert deploying.deployment_deploy(settled.pk) == "skipped"
    settled.refresh_from_db()
    assert (settled.status, settled.status_message) == (status, "as it was")
    assert deploying.deployment_deploy(999_999) == "skipped"


def test_it_fails_with_the_exporters_refusal_line(owner, roots, unreachable, tmp_path):
    no_tokenizer = serving.imported(owner, serving.checkpoint_folder(tmp_path / "bare", tokenizer=False))
    pending = serving.deployment(owner, no_tokenizer, unreachable, status=Status.PENDING)
    assert deploying.deployment_deploy(pending.pk) == Status.FAILED
    pending.refresh_from_db()
    assert pending.status == Status.FAILED
    assert pending.status_message.startswith("the export was refused: ") and "tokenizer" in pending.status_message
    assert "Traceback" not in pending.status_message


def test_it_fails_when_the_owner_may_no_longer_read_the_checkpoint(owner, small, unreachable, settings, tmp_path):
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": [tmp_path / "elsewhere"]}
    pending = serving.deployment(owner, small, unreachable, status=Status.PENDING)
    assert deploying.deployment_deploy(pending.pk) == Status.FAILED
    pending.refresh_from_db()
    assert "data roots" in pending.status_message


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
def test_it_starts_a_redelivered_export_over_and_says_when_triton_cannot_be_reached(owner, roots, unreachable,
                                                                                   served_checkpoint):
    checkpoint = serving.imported(owner, served_checkpoint)
    # a delivery of the task whose worker died while exporting
    stale = serving.deployment(owner, checkpoint, unreachable, model_name="redelivered", status=Status.EXPORTING,
                               claimed_at=timezone.now() - timedelta(hours=1), status_message="exporting: 30 s")
    assert deploying.deployment_deploy(stale.pk) == Status.FAILED
    stale.refresh_from_db()
    assert stale.status == Status.FAILED and stale.claimed_at > timezone.now() - timedelta(minutes=5)
    assert f"cannot be reached at {unreachable.http_url}" in stale.status_message
    assert "start it" in stale.status_message
    assert stale.report["smoke"]["token_ids"] and stale.report["name"] == "redelivered"
    assert Path(stale.repository_path) == Path(unreachable.model_repository).resolve() / "redelivered"
    assert deploying.deployment_deploy(stale.pk) == "skipped"  # failed is settled


def test_it_keeps_a_ready_deployment_ready_when_its_undeploy_cannot_reach_triton(owner, small, unreachable):
    ready = serving.deployment(owner, small, unreachable)
    assert deploying.deployment_undeploy(ready.pk) == "unreachable"
    ready.refresh_from_db()
    assert ready.status == Status.READY
    assert "could not unload" in ready.status_message and unreachable.http_url in ready.status_message


def test_it_stops_a_deploy_that_its_undeploy_overtook(owner, small, unreachable):
    pending = serving.deployment(owner, small, unreachable, status=Status.PENDING)
    assert deploying.deployment_undeploy(pending.pk) == "unreachable"
    pending.refresh_from_db()
    assert pending.status == Status.FAILED and "its deploy was stopped" in pending.status_message
    assert deploying.deployment_deploy(pending.pk) == "skipped"


def test_it_unloads_nothing_for_a_name_another_deployment_holds_now(owner, small, unreachable):
    old = serving.deployment(owner, small, unreachable, status=Status.FAILED)
    serving.deployment(owner, small, unreachable, status=Status.READY)
    assert deploying.deployment_undeploy(old.pk) == Status.UNLOADED  # Triton is not even asked
    old.refresh_from_db()
    assert old.status == Status.UNLOADED and "another deployment's" in old.status_message
    assert deploying.deployment_undeploy(old.pk) == "skipped"


# -- end to end -----------------------------------------------------------------------------------------------------

def _until(deployment_id: int, statuses: tuple, seconds: float) -> models.Deployment:
    deadline = time.monotonic() + seconds
    seen = []
    while time.monotonic() < deadline:
        deployment = models.Deployment.objects.get(pk=deployment_id)
        if not seen or seen[-1] != deployment.status:
            seen.append(deployment.status)
        if deployment.status in statuses:
            return deployment, seen
        time.sleep(0.2)
    pytest.fail(f"deployment {deployment_id} still {deployment.status} after {seconds} s: "
                f"{deployment.status_message}")


@pytest.mark.slow
@pytest.mark.once  # the real Triton and a trained checkpoint: once, on the first database
@pytest.mark.django_db(transaction=True)
def test_it_deploys_smoke_checks_serves_and_undeploys_through_the_worker(broker, roots, triton, served_checkpoint):
    user = User.objects.create_user("server-user")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    server = models.TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                                metrics_url=triton.metrics_url,
                                                model_repository=str(triton.repository))
    registered = api.post("/api/checkpoints/register/", {"path": str(served_checkpoint)}, format="json")
    assert registered.status_code == 201, registered.json()
    created = api.post("/api/deployments/", {"checkpoint": registered.json()["id"], "server": server.pk,
                                             "model_name": "through-the-worker"}, format="json")
    assert created.status_code == 201, created.json()

    deployment, seen = _until(created.json()["id"], (Status.READY, Status.FAILED), 300)
    assert deployment.status == Status.READY, deployment.status_message
    assert deployment.smoke_ok is True and deployment.ready_at is not None
    assert Status.EXPORTING in seen or Status.LOADING in seen
    smoke = deployment.report["smoke"]
    client = triton.client()
    assert client.model_ready("through-the-worker")

    answer = api.post(f"/api/deployments/{deployment.pk}/generate/",
                      {"prompt": smoke["prompt"], "max_tokens": smoke["max_tokens"]}, format="json")
    assert answer.status_code == 200 and answer.json()["token_ids"] == smoke["token_ids"]

    assert api.post(f"/api/deployments/{deployment.pk}/undeploy/").status_code == 200
    deployment, _ = _until(deployment.pk, (Status.UNLOADED,), 120)
    assert deployment.unloaded_at is not None
    assert not client.model_ready("through-the-worker")
    after = api.post(f"/api/deployments/{deployment.pk}/generate/", {"prompt": "x"}, format="json")
    assert after.status_code == 503 and "unloaded" in after.json()["detail"]
    client.close()


def test_it_exports_for_the_servers_instance_kind():
    deployment = models.Deployment(checkpoint=models.Checkpoint(path="/ckpt"), model_name="m", reduction="int8",
                                   tensor_parallel=2, instances=1, streaming=False,
                                   server=models.TritonServer(model_repository="/models", instance_kind="gpu"))
    command = deploying.export_command(deployment)
    assert command[command.index("--kind") + 1] == "gpu" and command[-1] == "--no-stream"
    assert command[command.index("--tensor-parallel") + 1] == "2"
