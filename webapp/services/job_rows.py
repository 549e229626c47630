"""A row that follows one job a worker runs as a process (a dataset's preparation, a checkpoint's evaluation): the
task claims it (pending or, redelivered, running → running, stamped with when this delivery began), says how far it
is, then settles it done or failed. Every write after the claim names the claim, so a delivery that another one has
superseded writes nothing."""
from django.db import models, transaction
from django.utils import timezone

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
UNDER_WAY = (PENDING, RUNNING)


def job_claim(model: type[models.Model], pk: int, message: str, related: tuple[str, ...] = ()):
    """The row, now running under this delivery's claim; None when it is settled or gone."""
    with transaction.atomic():
        row = model.objects.select_for_update(of=("self",)).select_related(*related).filter(pk=pk).first()
        if row is None or row.status in (DONE, FAILED):
            return None
        row.status, row.claimed_at, row.message = RUNNING, timezone.now(), message
        row.save(update_fields=["status", "claimed_at", "message"])
        return row


def _claimed(row):
    return type(row).objects.filter(pk=row.pk, claimed_at=row.claimed_at)


def job_progress(row, message: str, **fields) -> bool:
    """Say where a running job stands (and what else it now knows); False when another delivery has claimed it
    since."""
    return bool(_claimed(row).filter(status=RUNNING).update(message=message[:2000], **fields))


def job_settle(row, status: str, message: str, **fields) -> bool:
    """Done or failed, with what the process reported; False when another delivery has claimed it since."""
    return bool(_claimed(row).update(status=status, message=message[:2000], finished_at=timezone.now(), **fields))
