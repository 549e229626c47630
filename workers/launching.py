"""Launching a run without holding its row lock while the job starts.

Starting a job takes a while (the local supervisor up to its timeout; an sbatch or a REST call elsewhere), and a row
lock held that long would block every cancel, ingest and reconcile of the run. So a launch has three steps:

    claim   short transaction   a queued run not claimed by a live launch gets launching_since = now
    start   no transaction      the run folder's spec.json, then the job itself
    record  short transaction   attempt, job id, queued → submitted; the claim is cleared

A second delivery of the task finds the claim fresh and starts nothing. A claim older than the launcher's start
timeout plus a margin was left by a worker that died while starting, and is taken again. A run cancelled while its
job started keeps that job on record (so its last lines are still ingested) and the job is stopped at once.
"""
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from trainer.contract import RunSpec, SpecError
from trainer.contract.manifest import latest_checkpoint
from trainer.contract.records import LaunchRecord
from trainer.contract.runfolder import SPEC, used, write_json_atomic
from webapp.models import Run, RunStatus
from webapp.services import run_access_problems

from .launchers import LaunchError, Launcher, StartedJob, launcher_for

CLAIM_MARGIN_S = 60.0  # beyond the launcher's own timeout: writing spec.json, a slow database, clock skew


@dataclass(frozen=True)
class Claim:
    run_id: int
    since: datetime  # names this claim: the record step checks that the run still carries it
    spec: RunSpec
    launcher: Launcher
    backend: str
    env_setup: tuple[str, ...]
    attempt: int

    @property
    def run_dir(self) -> Path:
        return Path(self.spec.output_dir)


def run_launch(run_id: int) -> str:
    """queued → submitted: claim the run, start its job with no transaction open, record how. Otherwise nothing."""
    claim = _claim(run_id)
    if isinstance(claim, str):
        return claim
    try:
        claim.run_dir.mkdir(parents=True, exist_ok=True)
        _write_spec_once(claim.run_dir, claim.spec)
        # An earlier attempt's folder is continued (the trainer refuses a used folder otherwise): from its newest
        # checkpoint, or from step 0 when it saved none, the new records superseding the old ones.
        resume = used(claim.run_dir)
        from_checkpoint = latest_checkpoint(claim.run_dir) is not None
        started = claim.launcher.start(claim.run_dir, claim.spec.plan.world_size, resume, claim.env_setup)
    except (LaunchError, OSError) as exc:
        _release(claim, f"could not launch: {exc}")
        return "failed"
    return _record(claim, started, resume, from_checkpoint)


def _locked(run_id: int) -> Run:
    return Run.objects.select_for_update().select_related("cluster").get(pk=run_id)


def _claim(run_id: int) -> Claim | str:
    """The claim on a queued run, or what this delivery of the task did instead (the task's result)."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.status != RunStatus.QUEUED:
            return f"skipped: run is {run.status}"
        # Sharing may have been withdrawn, or the dataset's file changed, since the run was queued.
        problems = run_access_problems(run)
        try:
            launcher = launcher_for(run.cluster.kind)
            spec = run.run_spec()
        except (LaunchError, SpecError) as exc:
            problems = {"": [str(exc)], **problems}
        if problems:
            reasons = "; ".join(message for messages in problems.values() for message in messages)
            run.transition(RunStatus.FAILED, f"could not launch: {reasons}")
            run.launching_since = None
            run.save()
            return "failed"
        now = timezone.now()
        fresh_for = timedelta(seconds=launcher.start_timeout_s + CLAIM_MARGIN_S)
        if run.launching_since and now - run.launching_since < fresh_for:
            return f"skipped: a launch claimed the run at {run.launching_since.isoformat()} and is starting it"
        run.launching_since = now
        run.save(update_fields=["launching_since", "updated_at"])
        return Claim(run_id=run.pk, since=now, spec=spec, launcher=launcher, backend=run.cluster.kind,
                     env_setup=tuple(run.cluster.env_setup or ()), attempt=run.attempts + 1)


def _record(claim: Claim, started: StartedJob, resume: bool, from_checkpoint: bool) -> str:
    with transaction.atomic():
        run = _locked(claim.run_id)
        ours = run.launching_since == claim.since
        if ours:
            # A cancelled run keeps the job on record too: reconcile then watches it end and ingests its last lines.
            run.launching_since = None
            run.attempts, run.job_id = claim.attempt, started.job_id
            run.ingest_state = {**run.ingest_state, "job_ended": False}
            if run.status == RunStatus.QUEUED:
                run.transition(RunStatus.SUBMITTED, f"attempt {run.attempts} started"
                                                    + (" from a checkpoint" if from_checkpoint else ""))
            run.save()
    if ours:
        LaunchRecord(backend=claim.backend, job_id=started.job_id, attempt=claim.attempt, resume=resume,
                     command=started.command).write(claim.run_dir)
    if ours and run.status == RunStatus.SUBMITTED:
        return "submitted"
    claim.launcher.stop(claim.run_dir, started.job_id)
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
            run.transition(RunStatus.FAILED, reason)
        run.save()


def _write_spec_once(run_dir: Path, spec: RunSpec) -> None:
    """spec.json is written once before the first launch; later attempts must find the same spec."""
    path = run_dir / SPEC
    if path.exists():
        if json.loads(path.read_text()) != spec.to_dict():
            raise LaunchError(f"{path} holds a different spec; a run's spec never changes after its first launch")
        return
    write_json_atomic(path, spec.to_dict())
