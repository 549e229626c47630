"""A real Celery worker on the real Redis: tasks by name reach it and come back; the beat schedule is set."""
import time

import pytest

from tests.worker_fixtures import worker_database_url
from webapp.services.tasks import TaskName

# The worker opens the test database itself, so the session must create it even when only this module runs.
pytestmark = pytest.mark.django_db


def test_it_runs_the_health_task_on_a_worker_reaching_redis_and_the_database(worker):
    client, log = worker
    started = time.monotonic()
    result = client.send_task("workbench.health").get(timeout=90)
    assert result["database"] is True and result["worker"]
    assert worker_database_url().endswith("/" + result["database_name"].lstrip("/"))  # the tests' own database
    assert time.monotonic() - started < 90, log.read_text()


def test_it_registers_every_task_of_the_registry_and_no_other(worker):
    client, _ = worker
    client.send_task(TaskName.HEALTH.value).get(timeout=90)  # the worker is up
    registered = client.control.inspect(timeout=5).registered() or {}
    names = {name for tasks in registered.values() for name in tasks}
    ours = {name for name in names if not name.startswith("celery.")}  # Celery's own (chord_unlock, ...) aside
    assert ours == set(TaskName), f"registered by the worker but not in the registry: {ours - set(TaskName)}; " \
                                  f"in the registry but not registered: {set(TaskName) - ours}"


def test_it_schedules_the_health_check_in_beat():
    from workers.celery_app import app

    assert app.conf.beat_schedule["health-every-minute"]["task"] == "workbench.health"
    assert app.conf.beat_schedule["reconcile-runs"]["task"] == "workbench.runs.reconcile"
    assert {entry["task"] for entry in app.conf.beat_schedule.values()} <= set(TaskName)
