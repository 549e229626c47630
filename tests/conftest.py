"""Shared test settings: the real Redis the tests use, how the suite is spread over pytest-xdist workers, and a
counter of the planner's work."""
import os
from collections import Counter
from pathlib import Path

import pytest

from tests.xdist_groups import group_by_shared_fixtures, refuse_a_pytest_that_undoes_the_groups, worker_index

# slurm_cluster: a real two-node Slurm; triton and the checkpoints it serves; the Celery worker: each started on first use
pytest_plugins = ["tests.slurm_fixtures", "tests.deploy_fixtures", "tests.worker_fixtures"]

REPO = Path(__file__).resolve().parent.parent


def _test_redis_url() -> str:
    """Tests use their own Redis database so that they never see (or eat) a running product's tasks (database 0).
    Under pytest-xdist each worker has its own pair, its Celery worker's and a quiet one below it (15 and 14 for
    the first worker, 13 and 12 for the second, …), so that no worker's Celery worker takes another's tasks."""
    base, _, number = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15").rpartition("/")
    return f"{base}/{int(number or 15) - 2 * worker_index()}"


TEST_REDIS_URL = _test_redis_url()


# What marks a test as one that reads or writes the database, directly or through a fixture that does.
_DATABASE_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server"}


def pytest_addoption(parser):
    parser.addoption("--database-tests-only", action="store_true",
                     help="run only the tests that use the database (the test command's pass on SQLite)")


@pytest.hookimpl(tryfirst=True)  # before pytest-django orders the tests and pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """With --database-tests-only, leave out the tests no database reaches: a second backend changes nothing there.
    Then the tests that share an expensive fixture are put in one pytest-xdist group (tests/xdist_groups.py)."""
    if config.getoption("--database-tests-only"):
        keep, drop = [], []
        for item in items:
            uses = item.get_closest_marker("django_db") or _DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
            (keep if uses else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    group_by_shared_fixtures(items)


def pytest_configure(config):
    refuse_a_pytest_that_undoes_the_groups(config)


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
