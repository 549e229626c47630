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
from tests.xdist_groups import data_roots
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


class WorkerProcess:
    """The session's Celery worker process. It starts without Slurm; the first test that needs it to reach the test
    Slurm cluster starts it again with the cluster's environment (only the tests that use Slurm start the cluster,
    and under pytest-xdist only one worker runs them: tests.xdist_groups)."""

    def __init__(self, env: dict[str, str], log: Path):
        self.env, self.log = env, log
        self.base_env = dict(env)  # without any cluster's: a cluster's PATH must not outlive its turn
        self.process: subprocess.Popen | None = None
        self.slurm = None

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "--pool=solo",
                 "--loglevel=INFO", "--without-gossip", "--without-mingle", "--hostname=test-worker@%h"],
                cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def reach(self, cluster) -> None:
        """Restart with ``cluster``'s environment (SLURM_CONF, and a token for slurmrestd), once."""
        if self.slurm is cluster:
            return
        self.stop()
        self.env = {**self.base_env, **cluster.env, "SLURM_JWT": cluster.token(lifespan=6 * 3600)}
        self.slurm = cluster
        self.start()


@pytest.fixture(scope="session")
def worker_process(redis_url, tmp_path_factory, django_db_setup) -> WorkerProcess:
    """One worker process for the session, on the tests' Redis database and the test database."""
    env = {**os.environ, "REDIS_URL": redis_url,
           "WORKBENCH_LOCAL_SLOTS": str(LOCAL_SLOTS), "WORKBENCH_VAR": str(tmp_path_factory.mktemp("var")),
           # the tests' datasets lie in their own temporary folders, all under this one
           # (and the demo corpus, the dataset a first run made in the pages uses)
           "WORKBENCH_DATA_ROOTS": ":".join(map(str, [*data_roots(tmp_path_factory), presets.DEMO_TEXT.parent])),
           "DJANGO_SECRET_KEY": "a-worker-of-the-tests-signs-nothing-that-outlives-them-0123456789",
           # a rank silent this long in a step is hung: no tiny run's step comes near it, and a node the node
           # failure test kills is found down by Slurm well before (SlurmdTimeout 10 s)
           "WORKBENCH_HANG_AFTER_S": "25",
           "DATABASE_URL": worker_database_url()}
    process = WorkerProcess(env, tmp_path_factory.mktemp("worker") / "worker.log")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def worker(worker_process, redis_url):
    """The session's worker as (a Celery client of its Redis database, its log file)."""
    return Celery(broker=redis_url, backend=redis_url), worker_process.log


@pytest.fixture
def broker(worker, worker_process, redis_url, settings, request):
    """The session's worker, with this process's tasks (run_queue's launch) sent to it; able to submit to the test
    Slurm cluster when the test uses it."""
    from webapp.services import tasks
    cluster = next((name for name in ("any_slurm", "slurm_cluster_24", "slurm_cluster")
                    if name in request.fixturenames), None)
    if cluster:
        worker_process.reach(request.getfixturevalue(cluster))
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
    raise AssertionError(f"run {run_id} stuck in {run.status}: {run.status_message}\n{log_tails(run)}")


def final_loss(run: models.Run) -> float:
    """The loss of a finished run's last step, as ingested (a step redone after a resume keeps its last record)."""
    return run.metrics.get(kind="train", step=run.steps).loss


def log_tails(run: models.Run) -> str:
    """The end of each of the run's log files, for an assertion's message."""
    logs = sorted(Path(run.run_dir, "logs").glob("*")) if run.run_dir else []
    return "\n".join(f"== {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in logs) or "no logs"
