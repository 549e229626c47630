"""One real Celery worker for the session, on the tests' Redis database and the test database, and the way to send it
this process's tasks (the worker tests and the browser tests use it)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery import Celery

from tests.conftest import REPO
from trainer.contract import presets
from webapp import models


def worker_database_url() -> str:
    """The test database as a URL another process can open (on SQLite the settings make it a file)."""
    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user = settings["USER"] or "postgres"
    return f"postgres://{user}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}"


LOCAL_SLOTS = 2  # the worker's machine, whatever this one has: runs beyond two local ranks wait


def _slurm_env(request) -> dict[str, str]:
    """The test Slurm cluster's environment, so that the worker's launches reach it; none where it cannot run."""
    try:
        cluster = request.getfixturevalue("slurm_cluster")
    except pytest.skip.Exception:
        return {}
    return {**cluster.env, "SLURM_JWT": cluster.token(lifespan=6 * 3600)}  # for slurmrestd


@pytest.fixture(scope="session")
def worker(redis_url, tmp_path_factory, django_db_setup, request):
    """One worker process for the session, on the tests' Redis database and the test database, able to submit to
    the test Slurm cluster."""
    env = {**os.environ, **_slurm_env(request), "REDIS_URL": redis_url,
           "WORKBENCH_LOCAL_SLOTS": str(LOCAL_SLOTS), "WORKBENCH_VAR": str(tmp_path_factory.mktemp("var")),
           # the tests' datasets lie in their own temporary folders, all under this one
           # (and the demo corpus, the dataset a first run made in the pages uses)
           "WORKBENCH_DATA_ROOTS": f"{tmp_path_factory.getbasetemp()}:{presets.DEMO_TEXT.parent}",
           "DJANGO_SECRET_KEY": "a-worker-of-the-tests-signs-nothing-that-outlives-them-0123456789"}
    env["DATABASE_URL"] = worker_database_url()
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


@pytest.fixture
def broker(worker, redis_url, settings):
    """The session's worker, with this process's tasks (run_queue's launch) sent to it."""
    from webapp.services import tasks
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = redis_url
    tasks._client.cache_clear()
    yield worker[0]
    # What the test set going ends before its tables are emptied (a refit sent when a run completed would
    # otherwise read them while the flush truncates them): the one worker runs its queue in order.
    worker[0].send_task("workbench.health").get(timeout=120)
    tasks._client.cache_clear()


def reconcile_until(broker, run_id, done, timeout=180) -> models.Run:
    """Ask the worker for reconcile passes until ``done(run)``; on time out, say where the run is and its logs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        broker.send_task("workbench.runs.reconcile").get(timeout=60)
        run = models.Run.objects.get(pk=run_id)
        if done(run):
            return run
        time.sleep(0.5)
    run = models.Run.objects.get(pk=run_id)
    logs = sorted(Path(run.run_dir, "logs").glob("*")) if run.run_dir else []
    tails = "\n".join(f"== {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in logs)
    raise AssertionError(f"run {run_id} stuck in {run.status}: {run.status_message}\n{tails or 'no logs'}")
