"""Sending work to the Celery workers by task name (the web side never imports the workers' code).

Tasks are sent after the surrounding transaction commits, so a worker never looks for a row that is not there yet.
"""
from functools import lru_cache

from celery import Celery
from django.conf import settings
from django.db import transaction


@lru_cache(maxsize=1)
def _client() -> Celery:
    return Celery("workbench-web", broker=settings.CELERY_BROKER_URL, backend=settings.CELERY_RESULT_BACKEND)


def enqueue(task_name: str, *args, **kwargs) -> None:
    """Send ``task_name`` with ``args`` once the current transaction (if any) has committed."""
    transaction.on_commit(lambda: _client().send_task(task_name, args=args, kwargs=kwargs))


def send_now(task_name: str, *args, **kwargs):
    """Send at once and return the AsyncResult (for health checks and tests)."""
    return _client().send_task(task_name, args=args, kwargs=kwargs)
