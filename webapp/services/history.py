"""Writing a run's history: its events (trainer, scheduler, workbench) and its attempts. Called inside the
transaction that changes the run, so that what happened and the status it led to are committed together."""
from datetime import UTC, datetime

from django.utils import timezone

from ..finite import finite
from ..models import Attempt, Run, RunEvent

Source = RunEvent.Source


def record_event(run: Run, source: str, kind: str, message: str = "", at: float | None = None,
                 **data) -> RunEvent:
    """``at``: when it happened (seconds since the epoch, as events.jsonl has it); now when not given."""
    try:
        time = datetime.fromtimestamp(at, UTC) if at is not None else timezone.now()
    except (TypeError, ValueError, OverflowError, OSError):  # a damaged line's time
        time = timezone.now()
    return RunEvent.objects.create(run=run, source=source, kind=kind, attempt=run.attempts or None, time=time,
                                   message=message, data=finite(data))


def attempt_started(run: Run, backend: str, job_id: str, resume: bool, why: str, script: str = "",
                    command: list[str] | None = None) -> Attempt:
    attempt, _ = Attempt.objects.update_or_create(
        run=run, number=run.attempts,
        defaults={"backend": backend, "job_id": job_id, "resume": resume, "why": why[:200], "script": script,
                  "command": command or [], "submitted_at": timezone.now()})
    return attempt


def attempt_ended(run: Run, state: str, exit_code: int | None, reason: str, counts_as_restart: bool) -> None:
    """The run's current attempt ended: how, in the scheduler's word and in a person's."""
    Attempt.objects.filter(run=run, number=run.attempts, ended_at__isnull=True).update(
        ended_at=timezone.now(), state=state[:32], exit_code=exit_code, reason=reason,
        counts_as_restart=counts_as_restart)
