"""A real Celery worker on the real Redis: tasks by name reach it and come back; the beat schedule is set."""
import os
import subprocess
import sys
import time

import pytest
from celery import Celery

from tests.conftest import REPO

# The worker opens the test database itself, so the session must create it even when only this module runs.
pytestmark = pytest.mark.django_db


def _test_database_url() -> str | None:
    """The test database as a URL a separate process can open (SQLite's in-memory test database cannot be shared;
    then the worker uses its own SQLite file)."""
    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor != "postgresql":
        return None
    user = settings["USER"] or "postgres"
    return f"postgres://{user}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}"


@pytest.fixture(scope="module")
def worker(redis_url, tmp_path_factory, django_db_setup):
    """One worker process for this module, on the tests' Redis database and the test database."""
    env = {**os.environ, "REDIS_URL": redis_url, "WORKBENCH_VAR": str(tmp_path_factory.mktemp("var"))}
    env.pop("DATABASE_URL", None)
    if database_url := _test_database_url():
        env["DATABASE_URL"] = database_url
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "--pool=solo", "--loglevel=INFO",
             "--without-gossip", "--without-mingle", "--hostname=test-worker@%h"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    yield Celery(broker=redis_url, backend=redis_url), log
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def test_it_runs_the_health_task_on_a_worker_reaching_redis_and_the_database(worker):
    client, log = worker
    started = time.monotonic()
    result = client.send_task("workbench.health").get(timeout=90)
    assert result["database"] is True and result["worker"]
    if database_url := _test_database_url():
        assert database_url.endswith("/" + result["database_name"])  # the very database the tests use
    assert time.monotonic() - started < 90, log.read_text()


def test_it_registers_its_tasks_under_explicit_names(worker):
    client, _ = worker
    client.send_task("workbench.health").get(timeout=90)  # the worker is up
    registered = client.control.inspect(timeout=5).registered() or {}
    names = {name for tasks in registered.values() for name in tasks}
    assert "workbench.health" in names


def test_it_schedules_the_health_check_in_beat():
    from workers.celery_app import app

    assert app.conf.beat_schedule["health-every-minute"]["task"] == "workbench.health"
