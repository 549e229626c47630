"""Tasks, by explicit name. Each takes ids, not objects, and is safe to run twice."""
import logging
import platform
import time

from celery import shared_task
from django.db import connection
from django.utils import timezone

from . import launching, runs, tuning

log = logging.getLogger(__name__)


@shared_task(name="workbench.health")
def health() -> dict:
    """Proves a worker is consuming from the broker and can reach the database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        database_ok = cursor.fetchone()[0] == 1
    return {"worker": platform.node(), "time": timezone.now().isoformat(), "database": database_ok,
            "database_vendor": connection.vendor, "database_name": str(connection.settings_dict["NAME"]),
            "monotonic": time.monotonic()}


@shared_task(name="workbench.runs.launch")
def launch(run_id: int) -> str:
    return launching.run_launch(run_id)


@shared_task(name="workbench.runs.stop")
def stop(run_id: int) -> None:
    runs.run_stop(run_id)


@shared_task(name="workbench.runs.reconcile")
def reconcile() -> dict:
    """Every few seconds (beat): ingest active runs' folders, settle ended jobs, resend lost launches."""
    statuses = {}
    for run_id in runs.active_run_ids():
        try:
            statuses[run_id] = runs.run_reconcile(run_id).status
        except Exception:  # one broken run folder must not stop the others from being watched
            log.exception("reconciling run %s failed", run_id)
    for run_id in runs.stale_queued_run_ids():
        launch.delay(run_id)
    return statuses


@shared_task(name="workbench.tune.run")
def tune_run(job_id: int) -> str:
    return tuning.tune_job_run(job_id)
