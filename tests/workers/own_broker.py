"""A Redis server and Celery workers of a test's own, for tests that kill or restart them: the session's worker
(tests/worker_fixtures.py) never sees their tasks, and they never see its."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis
from celery import Celery

from tests.conftest import REPO
from tests.worker_fixtures import worker_database_url

WORKER_SECRET_KEY = "a-worker-of-the-tests-signs-nothing-that-outlives-them-0123456789"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class OwnRedis:
    """redis-server on a free port of 127.0.0.1, in its own folder, keeping nothing on disk: a restart loses every
    queued message and every task result, as a broker that crashed would."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--dir", str(self.folder), "--save", "", "--appendonly", "no"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                assert self.process.poll() is None, (self.folder / "redis.log").read_text()
                assert time.monotonic() < deadline, f"redis-server on port {self.port} does not answer"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None


def worker_env(redis_url: str, var: Path, data_roots: Path, **extra: str) -> dict[str, str]:
    """What the session's worker is started with, on another Redis."""
    return {**os.environ, "REDIS_URL": redis_url, "WORKBENCH_VAR": str(var), "WORKBENCH_DATA_ROOTS": str(data_roots),
            "DJANGO_SECRET_KEY": WORKER_SECRET_KEY, "DATABASE_URL": worker_database_url(), **extra}


def start_worker(env: dict[str, str], log: Path, name: str, app: str = "workers.celery_app") -> subprocess.Popen:
    """A Celery worker (one task at a time, as the session's) in a process group of its own: kill() ends it and
    whatever it started, at once."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", app, "worker", "--pool=solo", "--loglevel=INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat", f"--hostname={name}@%h"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)


def wait_until_consuming(client: Celery, worker: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    """Until a worker has answered a health task (any worker on this Redis: start one at a time to know which)."""
    result = client.send_task("workbench.health")
    deadline = time.monotonic() + timeout
    while not result.ready():
        assert worker.poll() is None, f"the worker exited with {worker.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no worker answered in {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def kill(worker: subprocess.Popen) -> None:
    """SIGKILL to the worker's process group: no task is acknowledged, nothing is cleaned up."""
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)


def stop(worker: subprocess.Popen) -> None:
    """A warm shutdown (SIGTERM), then SIGKILL for what is left of it."""
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    kill(worker)
