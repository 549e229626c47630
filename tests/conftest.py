"""Shared test settings: the real Redis the tests use, and a counter of the planner's work."""
import os
from collections import Counter
from pathlib import Path

import pytest

# slurm_cluster: a real two-node Slurm; triton and the checkpoints it serves; the Celery worker: each started on first use
pytest_plugins = ["tests.slurm_fixtures", "tests.deploy_fixtures", "tests.worker_fixtures"]

REPO = Path(__file__).resolve().parent.parent
# Tests use their own Redis database so that they never see (or eat) a running product's tasks.
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


# What marks a test as one that reads or writes the database, directly or through a fixture that does.
_DATABASE_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server"}


def pytest_addoption(parser):
    parser.addoption("--database-tests-only", action="store_true",
                     help="run only the tests that use the database (the test command's pass on SQLite)")


def pytest_collection_modifyitems(config, items):
    """With --database-tests-only, leave out the tests no database reaches: a second backend changes nothing there."""
    if not config.getoption("--database-tests-only"):
        return
    keep, drop = [], []
    for item in items:
        uses = item.get_closest_marker("django_db") or _DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        (keep if uses else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"these tests need a Redis server at {TEST_REDIS_URL} ({exc}); scripts/test.sh starts one")
    return TEST_REDIS_URL


# A valid tune request whose tune estimates tens of thousands of plans (175B on 64 CPU ranks, five global batches),
# almost none of which fit: what a check that must not tune is tried with.
HEAVY_TUNE = {"model": "gpt3-175b", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 64},
              "global_batch": [512, 1024, 1536, 2048, 3072]}


@pytest.fixture
def planner_calls(monkeypatch):
    """How often each Planner entry point runs: the real methods, counted."""
    from trainer.planner.estimate.core import Planner

    calls = Counter()
    for name in ("evaluate", "quick", "stage_memory"):
        real = getattr(Planner, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(Planner, name, spy)
    return calls


@pytest.fixture
def sent(monkeypatch):
    """The tasks the web side sends (by name, with their arguments), kept here instead of going to a broker."""
    from webapp.services import tasks

    sent = []

    class Client:
        def send_task(self, name, args=(), kwargs=None):
            sent.append((name, *args))

    monkeypatch.setattr(tasks, "_client", Client)
    return sent
