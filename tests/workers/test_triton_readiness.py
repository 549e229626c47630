"""A Triton server's readiness, kept by the reconcile pass: the deploy form and the admin say what is true of the
session's real Triton without anyone having asked its status endpoint. The same pass keeps the deployments true:
one that should be serving on a server that is up but has not loaded it is loaded again from its entry."""
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from deploy.client import GenerateParams
from tests.webapp import serving
from webapp.models import Deployment, TritonServer
from webapp.pages.deploy import DeployForm
from webapp.services.deployments import deployment_generate
from webapp.services.serving_state import STALLED_AFTER, deployments_reconcile
from webapp.services.tasks import TaskName
from workers import deploying, tasks

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


# -- the deployments' desired state against what the server has loaded -------------------------------------------

Status = Deployment.Status


@pytest.fixture
def server(triton):
    return TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                       metrics_url=triton.metrics_url, model_repository=str(triton.repository))


@pytest.fixture
def owner():
    return User.objects.create_user("deployer")


@pytest.fixture
def reconcile(django_capture_on_commit_callbacks):
    """One reconcile pass, as beat sends it; the tasks it sends go out (to ``sent``) as its writes commit."""
    def one_pass():
        with django_capture_on_commit_callbacks(execute=True):
            tasks.reconcile()
    return one_pass


@pytest.fixture
def exported(triton, served_checkpoint):
    """served_checkpoint's entry in the session Triton's repository, as a deploy writes it (not loaded)."""
    from deploy.export import ExportOptions, export

    return export(served_checkpoint, triton.repository, ExportOptions(name="reloaded", measure=False))


def _ready(owner, checkpoint_folder, server, name: str, report: dict, **fields) -> Deployment:
    """A deployment as the deploy task leaves it ready (its claim, its entry, its report)."""
    return serving.deployment(owner, serving.imported(owner, checkpoint_folder), server, name, report=report,
                              repository_path=report.get("path", ""), smoke_ok=True, ready_at=timezone.now(),
                              **{"status_message": "serving", "claimed_at": timezone.now(), **fields})


def _passes_until(reconcile, deployment: Deployment, status: str, passes: int = 10) -> None:
    """Reconcile passes, as beat sends them, until ``deployment`` has ``status`` (a pass that finds the server slow
    to answer, on a busy machine, leaves its deployments to the next one)."""
    for _ in range(passes):
        reconcile()
        deployment.refresh_from_db()
        if deployment.status == status:
            return
        time.sleep(0.5)
    pytest.fail(f"deployment {deployment.pk} still {deployment.status} after {passes} passes: "
                f"{deployment.status_message}")


def _until_unloaded(client, name: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while any(m["name"] == name and m.get("state") != "UNAVAILABLE" for m in client.repository_index()):
        assert time.monotonic() < deadline, f"{name} was still not unloaded after {seconds} s"
        time.sleep(0.1)


@pytest.mark.once  # the real Triton and worker: once, on the first database
@pytest.mark.slow
def test_a_ready_deployment_whose_model_the_server_lost_is_loaded_again_from_its_entry_and_answers(
        owner, server, triton, exported, served_checkpoint, reconcile, sent):
    client = triton.client()
    client.load("reloaded")
    client.unload("reloaded")  # as a restarted server has it: in its repository, not loaded
    _until_unloaded(client, "reloaded")
    deployment = _ready(owner, served_checkpoint, server, "reloaded", exported)

    _passes_until(reconcile, deployment, Status.RELOADING)
    assert "reloading" in deployment.status_message
    assert sent == [(TaskName.DEPLOYMENT_DEPLOY.value, deployment.pk)]
    reconcile()  # sent once: a second pass within RESEND_AFTER leaves it to the first task
    assert len(sent) == 1

    assert deploying.deployment_deploy(deployment.pk) == Status.READY  # the task, as the worker runs it
    deployment.refresh_from_db()
    assert deployment.status == Status.READY and deployment.smoke_ok, deployment.status_message
    assert "again" in deployment.status_message
    smoke = exported["smoke"]
    answer = deployment_generate(deployment, GenerateParams(prompt=smoke["prompt"], max_tokens=smoke["max_tokens"],
                                                            temperature=0.0))
    assert answer.token_ids == smoke["token_ids"]

    reconcile()  # loaded: nothing to do
    assert len(sent) == 1
    client.unload("reloaded")
    client.close()


def test_a_ready_deployment_whose_entry_is_gone_fails_with_the_reason(owner, server, tmp_path, reconcile,
                                                                       sent):
    checkpoint = serving.checkpoint_folder(tmp_path / "small")
    gone = _ready(owner, checkpoint, server, "gone", {"path": str(tmp_path / "models" / "gone"),
                                                     "smoke": {"prompt": "a", "max_tokens": 1, "token_ids": [1]}})
    _passes_until(reconcile, gone, Status.RELOADING)
    assert sent == [(TaskName.DEPLOYMENT_DEPLOY.value, gone.pk)]
    assert deploying.deployment_deploy(gone.pk) == Status.FAILED
    gone.refresh_from_db()
    assert gone.status == Status.FAILED
    assert f"its entry {tmp_path / 'models' / 'gone'} is no longer in the model repository" in gone.status_message
    reconcile()  # failed is settled: not sent again
    assert len(sent) == 1


def test_an_undeployed_deployment_its_server_has_not_loaded_is_unloaded_not_loaded_again(owner, server, tmp_path,
                                                                                         reconcile, sent):
    # its undeploy took the claim away but could not reach the server then: it stayed "ready"
    undeployed = _ready(owner, serving.checkpoint_folder(tmp_path / "small"), server, "undeployed", {},
                        claimed_at=None)
    _passes_until(reconcile, undeployed, Status.UNLOADED)
    assert undeployed.unloaded_at is not None and not sent


def test_a_reload_whose_server_cannot_be_reached_stays_reloading_and_is_sent_again_once_it_is_back(
        owner, server, triton, tmp_path, reconcile, sent):
    entry = tmp_path / "models" / "away"
    entry.mkdir(parents=True)
    (entry / "config.pbtxt").write_text('name: "away"\n')
    with serving.refusing_port() as port:
        away = TritonServer.objects.create(name="away", http_url=f"http://127.0.0.1:{port}",
                                           grpc_url=f"127.0.0.1:{port}", model_repository=str(entry.parent))
        reloading = _ready(owner, serving.checkpoint_folder(tmp_path / "small"), away, "away",
                           {"path": str(entry), "smoke": {"prompt": "a", "max_tokens": 1, "token_ids": [1]}},
                           status=Status.RELOADING)
        assert deploying.deployment_deploy(reloading.pk) == "waiting"
        reloading.refresh_from_db()
        assert reloading.status == Status.RELOADING and "cannot be reached" in reloading.status_message
        reconcile()  # the server is away: nothing is sent
        assert not sent
    # the server is back (this one: the session's Triton), and the reload has said nothing for RESEND_AFTER
    Deployment.objects.filter(pk=reloading.pk).update(server=server)
    Deployment.objects.filter(pk=reloading.pk).update(updated_at=timezone.now() - timedelta(minutes=1))
    for _ in range(10):  # a pass that finds the server slow to answer leaves it to the next
        reconcile()
        if sent:
            break
        time.sleep(0.5)
    assert sent == [(TaskName.DEPLOYMENT_DEPLOY.value, reloading.pk)]


def test_a_reload_whose_worker_died_after_the_load_is_sent_again_once_it_has_been_quiet_too_long(owner, tmp_path,
                                                                                                 sent):
    server = TritonServer.objects.create(name="anywhere", http_url="http://127.0.0.1:1", model_repository="/m")
    stalled = _ready(owner, serving.checkpoint_folder(tmp_path / "small"), server, "stalled", {},
                     status=Status.RELOADING)
    now = timezone.now()
    assert deployments_reconcile(server, {"stalled"}, now) == {}  # loaded, and its reload may still be smoke-checking
    Deployment.objects.filter(pk=stalled.pk).update(updated_at=now - STALLED_AFTER - timedelta(seconds=1))
    assert deployments_reconcile(server, {"stalled"}, now) == {stalled.pk: Status.RELOADING}
