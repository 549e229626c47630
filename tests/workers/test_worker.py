"""A real Celery worker on the real Redis: tasks by name reach it and come back; the beat schedule is set."""
import os
import subprocess
import sys
import time

import pytest
from celery import Celery

from tests.conftest import REPO


@pytest.fixture(scope="module")
def worker(redis_url, tmp_path_factory):
    """One worker process for this module, on the tests' Redis database."""
    env = {**os.environ, "REDIS_URL": redis_url, "WORKBENCH_VAR": str(tmp_path_factory.mktemp("var"))}
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
