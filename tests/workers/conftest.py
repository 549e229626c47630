"""One real Celery worker for the worker tests, on the tests' Redis database and the test database."""
import os
import subprocess
import sys

import pytest
from celery import Celery

from tests.conftest import REPO


def worker_database_url() -> str:
    """The test database as a URL another process can open (on SQLite the settings make it a file)."""
    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user = settings["USER"] or "postgres"
    return f"postgres://{user}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}/{settings['NAME']}"


@pytest.fixture(scope="session")
def worker(redis_url, tmp_path_factory, django_db_setup):
    """One worker process for the session, on the tests' Redis database and the test database."""
    env = {**os.environ, "REDIS_URL": redis_url, "WORKBENCH_VAR": str(tmp_path_factory.mktemp("var"))}
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
