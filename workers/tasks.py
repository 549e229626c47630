"""Tasks, by explicit name. Each takes ids, not objects, and is safe to run twice."""
import platform
import time

from celery import shared_task
from django.db import connection
from django.utils import timezone


@shared_task(name="workbench.health")
def health() -> dict:
    """Proves a worker is consuming from the broker and can reach the database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        database_ok = cursor.fetchone()[0] == 1
    return {"worker": platform.node(), "time": timezone.now().isoformat(), "database": database_ok,
            "database_vendor": connection.vendor, "database_name": str(connection.settings_dict["NAME"]),
            "monotonic": time.monotonic()}
