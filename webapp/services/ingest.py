"""Reading a run folder into the database: events move the status, metrics become rows, checkpoints and profiles are
registered. Idempotent and incremental: byte offsets into the JSONL files are kept on the run, a torn last line is
left for next time, and reading a record twice changes nothing (unique constraints). A step recorded again (a resumed
attempt redoing steps after its checkpoint) replaces the earlier record: the last record of a step is the one that
counts. Checkpoints that retention has deleted leave the registry."""
import json
import math
from pathlib import Path

from django.db import connection, transaction
from django.utils import timezone

from trainer.contract.manifest import read_manifest
from trainer.contract.records import Event, is_eval_row, is_step_row
from trainer.contract.runfolder import EVENTS, JOBS, METRICS, read_json, read_jsonl

from ..finite import finite
from ..goodput import ledger_add
from ..models import Checkpoint, Metric, Profile, Run, RunStatus
from ..selectors.checkpoints import checkpoints_without_deployments
from .calibration import calibration_record_add
from .evaluations import evaluations_after_checkpoint
from .history import Source, record_event
from .series import series_write
from .upsert import upsert


MAX_STEP = 2**31 - 1


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


METRIC_COLUMNS = ["run_id", "kind", "step", "loss", "values", "recorded_at"]


def _metric_rows(run: Run, records: list[dict]) -> list[tuple]:
    """One Metric row per (kind, step), the last record of it, as ``upsert`` takes them (the record as JSON)."""
    rows: dict[tuple[str, int], tuple] = {}
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    for record in records:
        if is_eval_row(record):
            kind, loss = "val", record["val_loss"]
        elif is_step_row(record):
            kind, loss = "train", record["loss"]
        else:
            continue
        if not isinstance(loss, (int, float)) or isinstance(loss, bool) or not math.isfinite(loss):
            loss = None
        if 0 <= record["step"] <= MAX_STEP:  # a damaged line may say anything; steps are stored unsigned, 32 bits
            rows[(kind, record["step"])] = (run.pk, kind, record["step"], loss, _json(record), now)
    return list(rows.values())


def _json(record: dict) -> str:
    """A diverged run logs NaN losses: stored as null, as JSON can hold them (the check costs nothing when every
    number is finite, which is almost always)."""
    try:
        return json.dumps(record, allow_nan=False)
    except ValueError:
        return json.dumps(finite(record))


def checkpoint_register(run: Run, event: dict) -> Checkpoint | None:
    folder = Path(run.run_dir) / event.get("path", "")
    manifest = read_manifest(folder)
    if manifest is None:
        return None  # pruned since, or not complete: never registered
    checkpoint, created = Checkpoint.objects.update_or_create(
        run=run, step=manifest.step,
        defaults={"path": str(folder), "manifest": finite(manifest.to_dict()), "size_bytes": _folder_size(folder),
                  "tokens_seen": manifest.tokens_seen})
    if created:
        evaluations_after_checkpoint(run, checkpoint)
    return checkpoint


def checkpoints_follow_retention(run: Run) -> None:
    """Drop the checkpoints whose folders the trainer's retention deleted. One a deployment was made from stays on
    record: the deployment's model repository holds its own copy of the weights, and its lineage must not break."""
    for checkpoint in checkpoints_without_deployments(run):
        if read_manifest(checkpoint.path) is None:
            checkpoint.delete()


def profile_register(run: Run, event: dict) -> Profile:
    folder = Path(run.run_dir) / event.get("path", "")
    summary = finite(read_json(folder / "summary.json") or {})
    profile, _ = Profile.objects.update_or_create(run=run, name=event.get("name", folder.name),
                                                  defaults={"path": str(folder), "summary": summary})
    return profile


def _event_message(event: dict) -> str:
    kind, step = event.get("event"), event.get("step")
    if isinstance(event.get("message"), str):  # the trainer said it in words already
        return event["message"]
    if kind == Event.FAILED:
        return f"rank {event.get('rank')} failed: {event.get('error', 'unknown error')}"
    if kind == Event.LOSS_SPIKE:
        first, last = (event.get("skipped_steps") or [None, None])[:2]
        return (f"loss spike at step {step} (loss {event.get('loss')}, median of the steps before "
                f"{event.get('median')}): back to step {event.get('rolled_back_to')}, the batches of steps "
                f"{first}–{last} skipped")
    if kind == Event.STARTED and event.get("resumed_from"):
        return f"started at step {step}, resumed from {event['resumed_from']}"
    return f"{kind.replace('_', ' ')} at step {step}" if step is not None else kind.replace("_", " ")


def _job_message(record: dict) -> str:
    job = f"job {record.get('job_id')}"
    if record["event"] == Event.JOB_STARTED:
        return f"{job} began on its nodes"
    return f"{job} left its nodes, exit code {record.get('exit_code')}"


def _apply_event(run: Run, event: dict) -> None:
    kind = event.get("event")
    if isinstance(kind, str) and kind:
        details = {k: v for k, v in event.items() if k not in ("event", "time", "traceback", "message")}
        record_event(run, Source.TRAINER, kind[:32], _event_message(event), at=event.get("time"), **details)
    if kind == Event.STARTED and run.status == RunStatus.SUBMITTED:
        run.transition(RunStatus.RUNNING)
    elif kind == Event.CHECKPOINT_SAVED:
        checkpoint_register(run, event)
    elif kind == Event.PROFILE_WRITTEN:
        profile_register(run, event)
    elif kind == Event.FINISHED and run.can_transition(RunStatus.COMPLETED):
        run.transition(RunStatus.COMPLETED, f"finished at step {event.get('step')}")
    elif kind == Event.FAILED and run.can_transition(RunStatus.FAILED):
        run.transition(RunStatus.FAILED, f"attempt {run.attempts} failed: {event.get('error', 'unknown error')}")


def _note(state: dict, event: dict) -> None:
    """What settling the attempt's job will want to know of an event (workers/runs.py)."""
    kind = event.get("event")
    if kind in Event.MILESTONES:
        state["last_event"] = kind
    if kind == Event.STARTED:  # where this attempt began: did it get further before it ended?
        state["started_at_step"] = event.get("step")
    elif kind == Event.TIME_LIMIT_NEAR:  # the stop that follows requeues the run
        state["time_limit_near"] = True
    elif kind == Event.FAILED and event.get("retry") is False:  # another attempt would fail the same way
        state["no_retry"] = True
    elif kind == Event.FAILED and event.get("out_of_memory"):  # the run may be re-planned
        state["out_of_memory"] = True
    elif kind == Event.STRAGGLER:  # its host is kept over attempts
        host = (event.get("straggler") or {}).get("host")
        if isinstance(host, str):
            state["straggler_nodes"] = sorted({*state.get("straggler_nodes", []), host})


@transaction.atomic
def run_ingest(run_id: int) -> Run:
    """Bring the database up to date with the run folder of run ``run_id``."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if not run.run_dir:
        return run
    state = dict(run.ingest_state or {})
    folder = Path(run.run_dir)

    ledger = state.setdefault("ledger", {})  # goodput's sums, per attempt (webapp.goodput)

    def to_ledger(record: dict) -> None:
        ledger_add(ledger, record, run.checkpoint_every, run.attempts)

    offset = state.get("jobs_offset", 0)
    for offset, record in read_jsonl(folder / JOBS, offset):
        to_ledger(record)
        if record.get("event") in (Event.JOB_STARTED, Event.JOB_ENDED):
            record_event(run, Source.SCHEDULER, record["event"], _job_message(record), at=record.get("time"),
                         **{k: v for k, v in record.items() if k not in ("event", "time", "rank")})
    state["jobs_offset"] = offset

    metrics, offset = [], state.get("metrics_offset", 0)
    for offset, record in read_jsonl(folder / METRICS, offset):
        metrics.append(record)
        to_ledger(record)
    upsert(Metric, METRIC_COLUMNS, ["run_id", "kind", "step"], _metric_rows(run, metrics))
    series_write(run, metrics)
    state["metrics_offset"] = offset
    train_steps = [r["step"] for r in metrics if is_step_row(r) and 0 <= r["step"] <= MAX_STEP]
    if train_steps:
        run.last_step = max(run.last_step, *train_steps)

    completed_before = run.status == RunStatus.COMPLETED
    offset, saved = state.get("events_offset", 0), False
    for offset, event in read_jsonl(folder / EVENTS, offset):
        to_ledger(event)
        _apply_event(run, event)
        saved = saved or event.get("event") == Event.CHECKPOINT_SAVED
        _note(state, event)
    state["events_offset"] = offset
    if saved:  # retention prunes when a checkpoint is saved
        checkpoints_follow_retention(run)

    run.ingest_state = state
    run.save()
    if run.status == RunStatus.COMPLETED and not completed_before:
        calibration_record_add(run)  # its measurement joins the cluster's calibration
    return run
