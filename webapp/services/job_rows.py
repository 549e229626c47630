"""The lifecycle of a background job's row (webapp.models.jobs.BackgroundJob: an evaluation, a dataset's preparation,
a checkpoint's conversion, a tuning job), the same for every kind: the task claims it (pending or, redelivered,
running → running, stamped with when this delivery began), says how far it is, then settles it done or failed.

Every write after the claim names the claim, so a delivery that another one has superseded (a redelivery after its
worker was thought dead) writes nothing and stops at its next progress; a settled row is never claimed again, so a
duplicate delivery does not run a finished job twice."""
from django.db import transaction
from django.utils import timezone

from ..finite import finite
from ..models.jobs import SETTLED, UNDER_WAY, BackgroundJob, JobStatus

PENDING, RUNNING, DONE, FAILED = JobStatus.PENDING, JobStatus.RUNNING, JobStatus.DONE, JobStatus.FAILED
MESSAGE_CHARS = 2000

__all__ = ["DONE", "FAILED", "PENDING", "RUNNING", "UNDER_WAY", "job_claim", "job_progress", "job_settle"]


def job_claim(model: type[BackgroundJob], pk: int, message: str, related: tuple[str, ...] = ()):
    """The row, now running under this delivery's claim; None when it is settled or gone."""
    with transaction.atomic():
        row = model.objects.select_for_update(of=("self",)).select_related(*related).filter(pk=pk).first()
        if row is None or row.status in SETTLED:
            return None
        row.status, row.claimed_at, row.message = RUNNING, timezone.now(), message
        row.save(update_fields=["status", "claimed_at", "message"])
        return row


def _claimed(row: BackgroundJob):
    return type(row).objects.filter(pk=row.pk, claimed_at=row.claimed_at)


def job_progress(row: BackgroundJob, message: str, **fields) -> bool:
    """Say where a running job stands (and what else it now knows); False when another delivery has claimed it
    since."""
    return bool(_claimed(row).filter(status=RUNNING).update(message=message[:MESSAGE_CHARS], **fields))


def job_settle(row: BackgroundJob, status: str, message: str, report: dict | None = None, **fields) -> bool:
    """Done or failed, with what the job reported; False when another delivery has claimed it since."""
    if report is not None:
        fields["report"] = finite(report)
    return bool(_claimed(row).filter(status=RUNNING).update(
        status=status, message=message[:MESSAGE_CHARS], finished_at=timezone.now(), **fields))
