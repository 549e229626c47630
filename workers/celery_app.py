"""The Celery application on Redis. Start a worker with `celery -A workers.celery_app worker -B`."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402  (settings must be named before Django is set up)

django.setup()

from django.conf import settings  # noqa: E402

from webapp.services.tasks import TaskName  # noqa: E402

app = Celery("workbench")
app.conf.update(
    broker_url=settings.CELERY_BROKER_URL,
    result_backend=settings.CELERY_RESULT_BACKEND,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    # A task is acknowledged only when it has finished, so a worker that dies mid-task leaves it for another one;
    # tasks are written to be idempotent for exactly this reason.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # A worker that loses Redis reconnects (every 2, 4, ... up to 30 s) for as long as Redis is away, instead of
    # exiting after Celery's default 100 tries (about 50 minutes): the runs' state is in the database and the run
    # folders, so a worker that comes back simply carries on with the next reconcile pass.
    broker_connection_retry=True,
    broker_connection_max_retries=None,
    result_expires=3600,
    timezone="UTC",
    beat_schedule={
        "health-every-minute": {"task": TaskName.HEALTH.value, "schedule": 60.0},
        "reconcile-runs": {"task": TaskName.RUNS_RECONCILE.value, "schedule": 5.0},
    },
)
app.autodiscover_tasks(["workers"], related_name="tasks", force=True)
