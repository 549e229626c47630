"""Watching and stopping runs (launching is in workers.launching). The database and the run folder hold all state;
any worker can pick up where another stopped, and every step is safe to repeat."""
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from trainer.contract.records import Event
from webapp import services
from webapp.models import Run, RunStatus
from webapp.services.ingest import run_ingest
from webapp.services.runs import LAUNCH_TASK

from .launchers import launcher_for


def run_stop(run_id: int) -> None:
    """Send the job SIGTERM: the trainer finishes its step, saves a checkpoint and exits."""
    run = Run.objects.select_related("cluster").get(pk=run_id)
    if run.job_id and run.run_dir:
        launcher_for(run.cluster.kind).stop(Path(run.run_dir), run.job_id)


def _job_ended(run: Run):
    if not run.job_id or not run.run_dir:
        return None
    state = launcher_for(run.cluster.kind).poll(Path(run.run_dir), run.job_id)
    return None if state.alive else state


def run_reconcile(run_id: int) -> Run:
    """Bring one run's status in line with its folder and its job; retry a failed job while attempts remain."""
    run = run_ingest(run_id)
    ended = None if run.ingest_state.get("job_ended") else _job_ended(run)
    if ended is not None:
        run = run_ingest(run_id)  # the last lines were written just before the job ended
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if run.status in (RunStatus.SUBMITTED, RunStatus.RUNNING):
                if run.ingest_state.get("last_event") == Event.STOPPED:
                    run.transition(RunStatus.QUEUED, "stopped by a signal; resuming from its checkpoint")
                else:
                    run.transition(RunStatus.FAILED, f"attempt {run.attempts}: the job ended (exit code "
                                                     f"{ended.exit_code}) without finishing; see logs/launcher.log")
            run.ingest_state = {**run.ingest_state, "job_ended": True}
            run.save()
        if run.status == RunStatus.QUEUED:
            services.enqueue(LAUNCH_TASK, run.pk)
    retry = run.status == RunStatus.FAILED and run.ingest_state.get("job_ended") and run.job_id \
        and not run.ingest_state.get("retry_refused")
    if retry and run.attempts < run.max_attempts:
        try:
            run = services.run_queue(run)  # resumes from its newest checkpoint, if any
        except ValidationError as exc:  # its owner may no longer use its parts: say so once, do not ask again
            Run.objects.filter(pk=run.pk).update(
                status_message=f"{run.status_message}; not retried: {' '.join(exc.messages)}",
                ingest_state={**run.ingest_state, "retry_refused": True})
            run.refresh_from_db()
    return run


def active_run_ids() -> list[int]:
    """Runs whose job may still be going: submitted or running, or failed or cancelled with a job not yet seen to
    end (its last metrics still come in, and a failed one is retried once its job is gone)."""
    active = list(Run.objects.filter(status__in=[RunStatus.SUBMITTED, RunStatus.RUNNING])
                  .values_list("pk", flat=True))
    ending = Run.objects.filter(status__in=[RunStatus.FAILED, RunStatus.CANCELLED]).exclude(job_id="")
    active += [r.pk for r in ending.only("pk", "ingest_state") if not r.ingest_state.get("job_ended")]
    return active


def stale_queued_run_ids(older_than_s: float = 120) -> list[int]:
    """Queued runs whose launch message may have been lost (a broker restart): send it again, it is idempotent."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    return list(Run.objects.filter(status=RunStatus.QUEUED, queued_at__lt=cutoff).values_list("pk", flat=True))
