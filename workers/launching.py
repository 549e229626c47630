"""Launching a run without holding its row lock while the scheduler is called.

Submitting takes a while (the local supervisor up to its timeout; an sbatch or a REST call elsewhere), and a row
lock held that long would block every cancel, ingest and reconcile of the run. So a launch has three steps:

    claim   short transaction   a queued run not claimed by a live launch gets launching_since = now; a run
                                whose launcher counts its own slots (local) waits queued while they are taken
    submit  no transaction      the run folder's spec.json; the job, unless the scheduler already has one named
                                for this run and attempt (a delivery of the task that died after submitting)
    record  short transaction   attempt, job id, queued → submitted; the claim is cleared

A second delivery of the task while the claim is fresh looks the job up by its name (the run, when its row was
made, and the attempt: a run of another workbench's database with the same id names its jobs otherwise) and adopts
it if it is there, else starts nothing. A claim older than the launcher's start timeout plus a margin was left by a
worker that died while starting, and is taken again. A run cancelled while its job started keeps that job on record
(so its last lines are still ingested) and the job is stopped at once.
"""
import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone

from trainer.contract import ParallelPlan, RunSpec, SpecError
from trainer.contract.manifest import latest_checkpoint
from trainer.contract.records import LaunchRecord
from trainer.contract.runfolder import SPEC, used, write_json_atomic
from webapp.models import Cluster, Run, RunStatus
from webapp.selectors.runs import runs_holding_local_slots
from webapp.services import run_access_problems
from webapp.services.history import Source, attempt_started, record_event

from .launchers import (Job, JobRequest, LaunchError, Launcher, SchedulerSettings, StartedJob, launcher_for,
                        row_stamp)

CLAIM_MARGIN_S = 60.0  # beyond the launcher's own timeout: writing spec.json, a slow database, clock skew
WAITING = "waiting_for_slots"
# What an attempt's record says about that attempt alone, cleared when the next one is submitted: the last
# milestone event (a stop of the previous attempt must not requeue this one), the scheduler's word, why it started.
ATTEMPT_STATE = ("next_why", "job_state", "job_reason", "last_event", "time_limit_near", "started_at_step", "hang",
                 "no_retry", "out_of_memory")


def scheduler_settings(cluster: Cluster) -> SchedulerSettings:
    return SchedulerSettings(kind=cluster.kind, partition=cluster.partition, account=cluster.account,
                             qos=cluster.qos, time_limit=cluster.time_limit,
                             stop_before_limit_s=cluster.stop_before_limit_s,
                             env_setup=tuple(cluster.env_setup or ()), container_image=cluster.container_image,
                             rest_url=cluster.rest_url)


@dataclass(frozen=True)
class Claim:
    since: datetime | None  # names this claim; None: another delivery holds a fresh claim, this one only adopts
    request: JobRequest
    launcher: Launcher
    why: str

    @property
    def run_id(self) -> int:
        return self.request.run_id


def avoided_nodes(run: Run) -> tuple[str, ...]:
    """The nodes the run's earlier attempts failed on, and those its trainer named stragglers where staff asked for
    them to be avoided too (WORKBENCH_EXCLUDE_STRAGGLERS)."""
    state = run.ingest_state
    stragglers = state.get("straggler_nodes", []) if django_settings.WORKBENCH["EXCLUDE_STRAGGLERS"] else []
    return tuple(sorted(set(state.get("excluded_nodes", [])) | set(stragglers)))


def run_launch(run_id: int) -> str:
    """queued → submitted: claim the run, submit its job with no transaction open, record how. Otherwise nothing."""
    Run.objects.filter(pk=run_id, launch_sent_at__isnull=False).update(launch_sent_at=None)  # this task is taken
    claim = _claim(run_id)
    if isinstance(claim, str):
        return claim
    # An earlier attempt's folder is continued (the trainer refuses a used folder otherwise): from its newest
    # checkpoint, or from step 0 when it saved none, the new records superseding the old ones.
    claim = replace(claim, request=replace(claim.request, resume=used(claim.request.run_dir)))
    request = claim.request
    try:
        found = claim.launcher.find(request)
        if found is not None:  # submitted by a delivery of this task that died before recording it
            return _record(claim, StartedJob(found, []))
        if claim.since is None:
            return "skipped: another launch claimed the run and is submitting its job"
        request.run_dir.mkdir(parents=True, exist_ok=True)
        _write_spec_once(request.run_dir, request.spec)
        started = claim.launcher.submit(request)
    except (LaunchError, OSError) as exc:
        if claim.since is not None:
            _release(claim, f"could not launch: {exc}")
        return "failed"
    return _record(claim, started)


def _locked(run_id: int) -> Run:
    return Run.objects.select_for_update().select_related("cluster").get(pk=run_id)


def _fail(run: Run, reason: str) -> str:
    run.transition(RunStatus.FAILED, reason)
    run.launching_since = None
    run.save()
    record_event(run, Source.WORKBENCH, "launch_failed", reason)
    return "failed"


def _claim(run_id: int) -> Claim | str:
    """The claim on a queued run, or what this delivery of the task did instead (the task's result)."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.status != RunStatus.QUEUED:
            return f"skipped: run is {run.status}"
        # Sharing may have been withdrawn, or the dataset's file changed, since the run was queued.
        problems = run_access_problems(run)
        settings = scheduler_settings(run.cluster)
        try:
            launcher = launcher_for(settings)
            spec = run.run_spec()
        except (LaunchError, SpecError) as exc:
            problems = {"": [str(exc)], **problems}
        if problems:
            return _fail(run, "could not launch: " + "; ".join(m for messages in problems.values() for m in messages))
        request = JobRequest(run_id=run.pk, attempt=run.attempts + 1, run_dir=Path(spec.output_dir), spec=spec,
                             settings=settings, exclude=avoided_nodes(run), made=row_stamp(run.created_at))
        why = run.ingest_state.get("next_why") or "first launch"
        now = timezone.now()
        fresh_for = timedelta(seconds=launcher.start_timeout_s + CLAIM_MARGIN_S)
        if run.launching_since and now - run.launching_since < fresh_for:
            return Claim(since=None, request=request, launcher=launcher, why=why)
        capacity = launcher.capacity()
        if capacity is not None:
            waiting = _slots_problem(run, spec.plan.world_size, capacity)
            if waiting is not None:
                return waiting
        run.launching_since = now
        run.ingest_state = {k: v for k, v in run.ingest_state.items() if k != WAITING}
        run.save(update_fields=["launching_since", "ingest_state", "updated_at"])
        return Claim(since=now, request=request, launcher=launcher, why=why)


def _slots_problem(run: Run, needs: int, total: int) -> str | None:
    """None when this machine has ``needs`` of its ``total`` CPU slots free for the run; else the run waits (or
    fails: it never fits). Local clusters' rows are locked first, in one order, so that two launches never take the
    same slots."""
    if needs > total:
        return _fail(run, f"could not launch: the plan needs {needs} CPU slots and this machine has {total}; "
                          f"use a smaller plan, or raise WORKBENCH_LOCAL_SLOTS if the machine can take it")
    list(Cluster.objects.select_for_update().filter(kind=Cluster.Kind.LOCAL).order_by("pk").values_list("pk"))
    in_use = sum(_world_size(other) for other in runs_holding_local_slots(other_than=run))
    if in_use + needs <= total:
        return None
    message = f"waiting for {needs} free CPU slots: {in_use} of {total} are in use by other runs"
    if run.status_message != message:
        run.status_message = message
        run.ingest_state = {**run.ingest_state, WAITING: True}
        run.save(update_fields=["status_message", "ingest_state", "updated_at"])
    return "waiting: " + message


def _world_size(run: Run) -> int:
    try:
        return ParallelPlan.from_dict((run.spec or {}).get("plan", {})).world_size
    except SpecError:
        return 1


def _record(claim: Claim, started: StartedJob) -> str:
    request = claim.request
    with transaction.atomic():
        run = _locked(claim.run_id)
        adopting = claim.since is None and run.status == RunStatus.QUEUED and run.attempts == request.attempt - 1
        ours = adopting or (claim.since is not None and run.launching_since == claim.since)
        if ours:
            # A cancelled run keeps the job on record too: reconcile then watches it end and ingests its last lines.
            run.launching_since = None
            run.attempts, run.job_id = request.attempt, started.job_id
            run.ingest_state = {k: v for k, v in run.ingest_state.items()
                                if k not in ATTEMPT_STATE} | {"job_ended": False}
            from_checkpoint = request.resume and latest_checkpoint(request.run_dir) is not None
            what = f"attempt {run.attempts} submitted as job {started.job_id}" + (
                " (found already submitted)" if not started.command else "") + (
                ", resuming from its newest checkpoint" if from_checkpoint else "")
            if run.status == RunStatus.QUEUED:
                run.transition(RunStatus.SUBMITTED, what)
            run.save()
            attempt_started(run, request.settings.kind, started.job_id, request.resume, claim.why, started.script,
                            started.command)
            record_event(run, Source.WORKBENCH, "submitted", f"{what}: {claim.why}", job_id=started.job_id)
        recorded_by_another = not ours and run.job_id == started.job_id
    if ours and started.command:
        LaunchRecord(backend=request.settings.kind, job_id=started.job_id, attempt=request.attempt,
                     resume=request.resume, command=started.command).write(request.run_dir)
    if ours and run.status == RunStatus.SUBMITTED:
        return "submitted"
    if recorded_by_another:
        return "skipped: another delivery of the launch already recorded this job"
    claim.launcher.cancel(Job(started.job_id, request.run_dir))
    return f"stopped the job just started: the run is {run.status}" if ours else \
        "stopped the job just started: another launch took the run over"


def _release(claim: Claim, reason: str) -> None:
    """The job did not start: a queued run fails with the reason (a cancelled one stays cancelled)."""
    with transaction.atomic():
        run = _locked(claim.run_id)
        if run.launching_since != claim.since:
            return  # another launch took the run over; what happens next is its business
        run.launching_since = None
        if run.status == RunStatus.QUEUED:
            _fail(run, reason)
        else:
            run.save()


def _write_spec_once(run_dir: Path, spec: RunSpec) -> None:
    """spec.json is written once before the first launch; later attempts must find the same spec (a re-plan after
    running out of memory rewrites the run's spec and spec.json together: workers/replanning.py)."""
    path = run_dir / SPEC
    if path.exists():
        if json.loads(path.read_text()) != spec.to_dict():
            raise LaunchError(f"{path} holds a different spec; a run's spec never changes after its first launch")
        return
    write_json_atomic(path, spec.to_dict())
