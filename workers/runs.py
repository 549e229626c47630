"""Watching and stopping runs (launching is in workers.launching). The database, the scheduler and the run folder hold
all state; any worker can pick up where another stopped, and every step is safe to repeat.

One reconcile pass: every active run's job is polled with one scheduler call per cluster (not one per run), the
folders that have grown are handed to ingest tasks (workers.ingesting), a running job whose ranks' heartbeats show a
hung collective is cancelled (workers.hangs), and a job seen to end settles its run: completed, requeued (it stopped
itself with a checkpoint: a time limit near, a preemption; or it hung; or a node failed under it, which the next
attempt avoids), restarted from its newest checkpoint while restarts remain, or failed with the scheduler's reason.
The same pass asks each Triton server whether it is ready, so that what the pages say of a server is at most one
pass old.
"""
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from trainer.contract.records import Event, Heartbeat
from trainer.contract.runfolder import EVENTS, JOBS, METRICS
from webapp import services
from webapp.models import Cluster, Run, RunStatus
from webapp.selectors.runs import active_runs, run_with_cluster
from webapp.services.history import Source, attempt_ended, record_event
from webapp.services.ingest import run_ingest
from webapp.services.triton import triton_readiness_refresh

from .converting import resend_unclaimed
from .hangs import find_hang
from .launchers import Job, JobState, JobStates, LaunchError, launcher_for
from .ingesting import request_ingest
from .launching import WAITING, scheduler_settings
from .replanning import no_replan_reason, replan

log = logging.getLogger(__name__)


def run_stop(run_id: int) -> None:
    """Stop the run's job: SIGTERM (the trainer finishes its step, saves a checkpoint and exits), then for good."""
    run = run_with_cluster(run_id)
    if run.job_id and run.run_dir:
        launcher_for(scheduler_settings(run.cluster)).cancel(Job(run.job_id, Path(run.run_dir)))


def _folder_grew(run: Run) -> bool:
    state = run.ingest_state
    for name, key in ((METRICS, "metrics_offset"), (EVENTS, "events_offset"), (JOBS, "jobs_offset")):
        try:
            if os.stat(Path(run.run_dir) / name).st_size > state.get(key, 0):
                return True
        except OSError:
            continue
    return False


@dataclass
class PassReport:
    runs: int = 0
    scheduler_calls: dict[str, int] = field(default_factory=dict)
    settled: dict[int, str] = field(default_factory=dict)
    ingest_requested: int = 0
    triton_ready: dict[str, bool] = field(default_factory=dict)


def reconcile_pass() -> PassReport:
    """Bring every active run in line with its folder and its job; launch what waits."""
    report, grown = PassReport(), []
    by_cluster: dict[int, list[Run]] = defaultdict(list)
    for run in active_runs():
        by_cluster[run.cluster_id].append(run)
    for runs in by_cluster.values():
        settings = scheduler_settings(runs[0].cluster)
        try:
            launcher = launcher_for(settings)
            states = launcher.poll([Job(run.job_id, Path(run.run_dir)) for run in runs if run.job_id and run.run_dir])
        except LaunchError as exc:  # the scheduler is down: the folders are still read, the jobs asked next time
            log.warning("cluster %s: %s", runs[0].cluster.name, exc)
            launcher, states = None, {}
        calls = len(launcher.calls) if launcher is not None else 0
        report.scheduler_calls[settings.kind] = report.scheduler_calls.get(settings.kind, 0) + calls
        for run in runs:
            report.runs += 1
            if _folder_grew(run):
                grown.append(run.pk)
            try:
                status = reconcile_run(run, states.get(run.job_id), ingest=False)
                if status is None and launcher is not None:
                    cancel_if_hung(run, states.get(run.job_id), launcher)
            except Exception:  # one broken run folder must not stop the others from being watched
                log.exception("reconciling run %s failed", run.pk)
                continue
            if status is not None:
                report.settled[run.pk] = status
        ended = [run for run in runs if run.pk in report.settled and run.job_id]
        if ended and launcher is not None:
            record_accounting(launcher, ended)
    report.ingest_requested = request_ingest([run_id for run_id in grown if run_id not in report.settled])
    services.launch_send(launchable_run_ids())
    resend_unclaimed()  # imports and exports whose task message was lost
    report.triton_ready = triton_readiness_refresh()
    return report


ACCOUNTING_WAIT_S = 5.0  # how long a pass waits for slurmctld to hand an ended job's record to slurmdbd


def record_accounting(launcher, runs: list[Run]) -> None:
    """Slurm's accounting of the jobs that ended this pass, one event each: how each step ended, its exit code, its
    time and peak memory, who cancelled the job, how long it queued and ran. One sacct for all of them, again for a
    few seconds while a record is not final yet (slurmctld sends the job's end to slurmdbd on its own time)."""
    deadline = time.monotonic() + ACCOUNTING_WAIT_S
    waiting = {run.job_id: run for run in runs}
    while waiting:
        try:
            records = launcher.accounting(list(waiting))
        except LaunchError as exc:
            log.warning("accounting of jobs %s: %s", ", ".join(waiting), exc)
            return
        for job_id, record in records.items():
            if job_id in waiting and record.state not in JobStates.ACTIVE:
                record_event(waiting.pop(job_id), Source.SCHEDULER, "accounting", record.summary(),
                             **record.to_dict())
        if not records or time.monotonic() > deadline:  # no accounting on this cluster, or it is late: left out
            return
        time.sleep(0.5)


def reconcile_run(run: Run, job: JobState | None, ingest: bool = True) -> str | None:
    """One run, given its job's state (None: unknown this pass); the run's status if its job was seen to end.
    ``ingest``: read a grown folder in here (the pass leaves that to ingest tasks; a job seen to end is read to its
    last line here in any case)."""
    if ingest and _folder_grew(run):
        run = run_ingest(run.pk)
    if job is None:
        return None
    if (job.state, job.reason) != (run.ingest_state.get("job_state"), run.ingest_state.get("job_reason")):
        _scheduler_says(run, job)
    if job.alive or run.ingest_state.get("job_ended"):
        return None
    return _settle(run.pk, job).status


def cancel_if_hung(run: Run, job: JobState | None, launcher) -> None:
    """A running job whose ranks have all waited in a step for far longer than a step takes (``hangs``): say which
    rank the others wait for, and cancel the job; when it has ended, ``_settle`` requeues the run."""
    if job is None or not job.running or run.ingest_state.get("hang") or not run.run_dir:
        return
    beats = Heartbeat.read_all(run.run_dir)
    attempt = run.attempt_records.filter(number=run.attempts).first() if beats else None
    if attempt is None:
        return
    conf = django_settings.WORKBENCH
    hang = find_hang(beats, time.time(), attempt.submitted_at.timestamp(), conf["HANG_STEP_MULTIPLE"],
                     conf["HANG_AFTER_S"])
    if hang is None:
        return
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        run.ingest_state = {**run.ingest_state, "hang": hang.to_dict()}
        run.save(update_fields=["ingest_state", "updated_at"])
        record_event(run, Source.WORKBENCH, "hang", f"job {run.job_id} {hang.message}: cancelling it to requeue the "
                                                    f"run from its newest checkpoint", job_id=run.job_id,
                     **hang.to_dict())
    try:
        launcher.cancel(Job(run.job_id, Path(run.run_dir)))
    except LaunchError as exc:  # asked again on the next pass
        log.warning("run %s: cancelling its hung job %s: %s", run.pk, run.job_id, exc)
        state = {k: v for k, v in run.ingest_state.items() if k != "hang"}
        Run.objects.filter(pk=run.pk).update(ingest_state=state)


def _scheduler_says(run: Run, job: JobState) -> None:
    """A new state or reason of the job becomes an event of the run (Slurm's PENDING reason, TIMEOUT, …)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        run.ingest_state = {**run.ingest_state, "job_state": job.state, "job_reason": job.reason}
        run.save(update_fields=["ingest_state", "updated_at"])
        message = f"job {run.job_id}: {job.state.lower()}" + (f": {job.reason}" if job.reason else "")
        record_event(run, Source.SCHEDULER, job.state.lower()[:32], message, job_id=run.job_id, state=job.state,
                     reason=job.reason, exit_code=job.exit_code)


def _settle(run_id: int, job: JobState) -> Run:
    """The job has ended: what that means for the run, and another attempt if it should have one."""
    run = run_ingest(run_id)  # the last lines were written just before the job ended
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        counts_as_restart, was = False, run.status
        out_of_memory = job.state == JobStates.OUT_OF_MEMORY or run.ingest_state.get("out_of_memory")
        if out_of_memory and run.status in (RunStatus.SUBMITTED, RunStatus.RUNNING, RunStatus.FAILED):
            _answer_out_of_memory(run, job)  # the plan's doing: another plan, or no more attempts
        elif run.status in (RunStatus.SUBMITTED, RunStatus.RUNNING):
            if run.ingest_state.get("hang") and _saved_since_start(run):
                why = "requeued after a hung collective"
                run.transition(RunStatus.QUEUED, f"attempt {run.attempts} hung and was cancelled; {why}, from its "
                                                 f"newest checkpoint")
                run.ingest_state = {**run.ingest_state, "next_why": why}
            elif run.ingest_state.get("hang"):  # it hung before saving anything: a restart, so it cannot loop
                counts_as_restart = True
                run.transition(RunStatus.FAILED, f"attempt {run.attempts} hung before it saved a checkpoint and "
                                                 f"was cancelled")
            elif run.ingest_state.get("last_event") == Event.STOPPED:
                why = "requeued after its time limit" if run.ingest_state.get("time_limit_near") else \
                    "requeued after a stop signal (preemption)"
                run.transition(RunStatus.QUEUED, f"attempt {run.attempts} stopped with a checkpoint; {why}")
                run.ingest_state = {**run.ingest_state, "next_why": why, "unsaved_requeues": 0}
            elif run.ingest_state.get("time_limit_near") and _may_requeue_unsaved(run):
                # Asked to stop before its limit, the trainer ended before it could save (the signal came while it
                # was starting: Slurm sends it up to a minute early). It resumes from its newest checkpoint without
                # using a restart, unless attempts keep ending so without saving anything new.
                why = "requeued after its time limit"
                run.transition(RunStatus.QUEUED, f"attempt {run.attempts} was stopped at its time limit before it "
                                                 f"could save; {why}, from its newest checkpoint")
                run.ingest_state = {**run.ingest_state, "next_why": why}
            elif job.state == JobStates.NODE_FAIL:  # not the run's doing: no restart is used
                why = "requeued after a node failure"
                nodes = ", ".join(job.failed_nodes) or "a node"
                excluded = sorted(set(run.ingest_state.get("excluded_nodes", [])) | set(job.failed_nodes))
                run.transition(RunStatus.QUEUED, f"attempt {run.attempts}: {nodes} failed under the job; {why}"
                                                 + (f", excluding {', '.join(excluded)}" if excluded else ""))
                run.ingest_state = {**run.ingest_state, "next_why": why, "excluded_nodes": excluded}
                _count_node_failures(run.cluster_id, job.failed_nodes)
            elif job.state == JobStates.PREEMPTED:
                run.transition(RunStatus.QUEUED, f"attempt {run.attempts}: {job.reason}; requeued")
                run.ingest_state = {**run.ingest_state, "next_why": "requeued after preemption"}
            else:
                counts_as_restart = True
                run.transition(RunStatus.FAILED, f"attempt {run.attempts} ended without finishing: "
                                                 f"{job.reason or job.state.lower()}")
        elif run.status == RunStatus.FAILED:  # the trainer said so itself (its failed event) before its job ended
            # unless it said another attempt would fail the same way (a loss that spikes again where it spiked)
            counts_as_restart = not run.ingest_state.get("no_retry")
        attempt_ended(run, job.state, job.exit_code, job.reason, counts_as_restart)
        run.ingest_state = {**run.ingest_state, "job_ended": True}
        run.save()
        if run.status != was:
            record_event(run, Source.WORKBENCH, run.status, run.status_message)
    if run.status == RunStatus.QUEUED:
        services.launch_send([run.pk])
    elif run.status == RunStatus.FAILED and counts_as_restart and run.restarts < run.max_restarts:
        run = _restart(run, job)
    return run


def _answer_out_of_memory(run: Run, job: JobState) -> None:
    """Re-planned and queued again (no restart used), or failed for good: the same plan would run out again."""
    was = run.run_spec().plan
    said = job.reason if job.state == JobStates.OUT_OF_MEMORY else run.status_message
    found = replan(run)
    if found is None:
        message = f"attempt {run.attempts} ran out of memory ({said}); {no_replan_reason(run)}"
        if run.status == RunStatus.FAILED:  # the trainer said so first: the message says what to do about it
            run.status_message = message
        else:
            run.transition(RunStatus.FAILED, message)
        return
    run.transition(RunStatus.QUEUED, f"attempt {run.attempts} ran out of memory; {found.describe(was)}")
    run.ingest_state = {**run.ingest_state, "next_why": "re-planned after running out of memory"}
    record_event(run, Source.WORKBENCH, "replanned", found.describe(was), reason=said, was=was.to_dict(),
                 **found.to_dict())


def _count_node_failures(cluster_id: int, nodes: tuple[str, ...]) -> None:
    """Each failed node's count on its cluster (in the transaction that settles the run)."""
    if nodes:
        cluster = Cluster.objects.select_for_update().get(pk=cluster_id)
        cluster.node_failures = {**cluster.node_failures,
                                 **{node: cluster.node_failures.get(node, 0) + 1 for node in nodes}}
        cluster.save(update_fields=["node_failures", "updated_at"])


UNSAVED_REQUEUES = 3  # time-limit stops in a row that saved nothing new, before the next counts as a failure


def _may_requeue_unsaved(run: Run) -> bool:
    """Whether an attempt that ended at its time limit without its stop record may be requeued for free: it saved a
    checkpoint beyond where it started, or fewer than UNSAVED_REQUEUES attempts in a row have saved nothing."""
    unsaved = 0 if _saved_since_start(run) else run.ingest_state.get("unsaved_requeues", 0) + 1
    run.ingest_state = {**run.ingest_state, "unsaved_requeues": unsaved}
    return unsaved < UNSAVED_REQUEUES


def _saved_since_start(run: Run) -> bool:
    """Whether the current attempt saved a checkpoint beyond the step it started from."""
    started = run.ingest_state.get("started_at_step")
    newest = run.checkpoints.order_by("-step").values_list("step", flat=True).first()
    return isinstance(started, int) and newest is not None and newest > started


def _restart(run: Run, job: JobState) -> Run:
    why = f"restart {run.restarts + 1} of {run.max_restarts} after {job.state.lower()}"
    Run.objects.filter(pk=run.pk).update(ingest_state={**run.ingest_state, "next_why": why})
    try:
        return services.run_queue(run)  # resumes from its newest checkpoint, if any
    except ValidationError as exc:  # its owner may no longer use its parts: say so once, do not ask again
        Run.objects.filter(pk=run.pk).update(status_message=f"{run.status_message}; not restarted: "
                                                            f"{' '.join(exc.messages)}")
        run.refresh_from_db()
        return run


def launchable_run_ids(older_than_s: float = 120, waiting_again_s: float = 10) -> list[int]:
    """Queued runs to send the launch task for again (it is idempotent): those waiting for local CPU slots, and
    those queued for a while, whose launch message may have been lost (a broker restart) or whose claim a worker
    that died left behind (a fresh claim makes the task skip; a stale one is taken over). Not while the task sent
    last still waits in the queue, unless it was sent long ago: hundreds of runs submitted at once would otherwise
    be sent again at every pass, and the queue would grow faster than the workers empty it."""
    now = timezone.now()

    def none_waiting_since(seconds: float) -> Q:
        return Q(launch_sent_at__isnull=True) | Q(launch_sent_at__lt=now - timedelta(seconds=seconds))

    queued = Run.objects.filter(status=RunStatus.QUEUED)
    waiting = queued.filter(none_waiting_since(waiting_again_s), launching_since__isnull=True,
                            **{f"ingest_state__{WAITING}": True})
    lost = queued.filter(none_waiting_since(older_than_s), queued_at__lt=now - timedelta(seconds=older_than_s))
    return list((waiting | lost).values_list("pk", flat=True).distinct())
