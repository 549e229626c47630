"""Personas and objects for the web tests: alice and bob are ordinary users, staff is staff."""
import contextlib
from dataclasses import dataclass

import pytest
import redis
from django.contrib.auth.models import User
from django.core.cache import cache
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from trainer.contract import presets
from webapp import models
from tests.webapp import serving
from webapp.services import tasks


def _user(username: str, is_staff: bool = False) -> User:
    user = User.objects.create_user(username, f"{username}@example.org", "correct-horse-battery", is_staff=is_staff)
    Token.objects.create(user=user)
    return user


@pytest.fixture
def alice(db):
    return _user("alice")


@pytest.fixture
def bob(db):
    return _user("bob")


@pytest.fixture
def staff(db):
    return _user("staff", is_staff=True)


def client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {user.auth_token.key}")
    return client


@pytest.fixture
def api():
    return client_for


@pytest.fixture
def cluster8(db):
    return models.Cluster.objects.create(name="a100x8", spec=presets.cluster("A100-SXM-80GB", 1, 8).to_dict())


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Hashing a persona's password the production way takes most of a second; the tests make hundreds."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Sign-in attempts are counted in the cache, which outlives a test: each test starts with none."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def data_root(tmp_path, settings):
    """The one data root every user reads, with a corpus in it; uploads go to a folder inside it, as by default."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 50)
    settings.WORKBENCH = {**settings.WORKBENCH, "DATA_ROOTS": [root], "RUNS_ROOT": tmp_path / "runs",
                          "RUNS_ROOTS": [tmp_path / "runs"], "UPLOAD_ROOT": root / "uploads"}
    return root


@pytest.fixture
def gpt2_small(alice):
    return models.ModelConfig.objects.create(owner=alice, name="gpt2-small",
                                             spec=presets.MODELS["gpt2-small"].to_dict())


@pytest.fixture
def plan222(alice, gpt2_small, cluster8):
    from trainer.contract import ParallelPlan
    spec = ParallelPlan(dp=2, tp=2, pp=2, micro_batch=2, global_batch=16).to_dict()
    return models.ParallelismPlan.objects.create(owner=alice, name="2x2x2", model_config=gpt2_small,
                                                 cluster=cluster8, spec=spec)


@pytest.fixture
def corpus(alice, data_root):
    return models.Dataset.objects.create(owner=alice, name="corpus", path=str(data_root / "corpus.txt"))


@contextlib.contextmanager
def _broker(url: str, settings):
    """Point the web side's task client at Redis database ``url``, emptied before and after."""
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = url
    tasks._client.cache_clear()
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield client
    client.flushdb()
    tasks._client.cache_clear()


@pytest.fixture
def test_broker(redis_url, settings):
    """The tests' Redis database, the one the workers' tests' Celery worker listens on."""
    with _broker(redis_url, settings) as client:
        yield client


@pytest.fixture
def quiet_broker(redis_url, settings):
    """A Redis database no worker listens on, the one below the tests' own (tests.conftest). pytest-django runs
    transactional tests among the workers' tests, whose Celery worker would take a queued run and change its status
    under a test that only sends requests."""
    base, _, number = redis_url.rpartition("/")
    with _broker(f"{base}/{int(number) - 1}", settings) as client:
        yield client


# -- serving ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def refused_port():
    with serving.refusing_port() as port:
        yield port


@pytest.fixture
def nowhere(db, refused_port, tmp_path):
    """A Triton server whose URLs point at a port nothing listens on."""
    return models.TritonServer.objects.create(
        name="nowhere", http_url=f"http://127.0.0.1:{refused_port}", grpc_url=f"127.0.0.1:{refused_port}",
        metrics_url=f"http://127.0.0.1:{refused_port}", model_repository=str(tmp_path / "models"))


@pytest.fixture
def small_checkpoint(alice, data_root):
    """Alice's imported checkpoint of serving.SMALL_MODEL (a manifest, no weights)."""
    return serving.imported(alice, serving.checkpoint_folder(data_root / "small"))


@dataclass(frozen=True)
class ServedModel:
    name: str
    report: dict
    server: object  # the session's Triton (tests.deploy_fixtures)


SERVED_NAME = "web-served"


@pytest.fixture(scope="session")
def served_model(triton, served_checkpoint):
    """served_checkpoint exported into the session's Triton and loaded, once for all the web tests that generate
    (a load costs seconds); the report is the exporter's. Unloaded at the end of the session."""
    from deploy.export import ExportOptions, export

    report = export(served_checkpoint, triton.repository, ExportOptions(name=SERVED_NAME, measure=False))
    client = triton.client()
    client.load(SERVED_NAME)
    yield ServedModel(SERVED_NAME, report, triton)
    client.unload(SERVED_NAME)
    client.close()


@pytest.fixture
def served_deployment(alice, served_model, served_checkpoint):
    """Alice's ready deployment of the served model, on a server row of the session's Triton."""
    triton = served_model.server
    server = models.TritonServer.objects.create(name="local", http_url=triton.http_url, grpc_url=triton.grpc_url,
                                                metrics_url=triton.metrics_url,
                                                model_repository=str(triton.repository))
    checkpoint = serving.imported(alice, served_checkpoint)
    return serving.deployment(alice, checkpoint, server, SERVED_NAME, report=served_model.report, smoke_ok=True,
                              ready_at=timezone.now())
