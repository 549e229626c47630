"""Reading a run folder into the database: events move the status, metrics become rows, checkpoints and profiles are
registered. Idempotent and incremental: byte offsets into the JSONL files are kept on the run, a torn last line is
left for next time, and reading a record twice changes nothing (unique constraints). A step recorded again (a resumed
attempt redoing steps after its checkpoint) replaces the earlier record: the last record of a step is the one that
counts. Checkpoints that retention has deleted leave the registry."""
from pathlib import Path

from django.db import transaction

from trainer.contract.manifest import read_manifest
from trainer.contract.records import Event, is_eval_row, is_step_row
from trainer.contract.runfolder import EVENTS, METRICS, read_json, read_jsonl

from ..finite import finite
from ..models import Checkpoint, Metric, Profile, Run, RunStatus


MAX_STEP = 2**31 - 1


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _metric_rows(run: Run, records: list[dict]) -> list[Metric]:
    rows: dict[tuple[str, int], Metric] = {}  # one row per (kind, step): the last record of it
    for record in map(finite, records):  # a diverged run logs NaN losses; stored as null, as JSON can hold them
        if is_eval_row(record):
            kind, loss = "val", record["val_loss"]
        elif is_step_row(record):
            kind, loss = "train", record["loss"]
        else:
            continue
        if not isinstance(loss, (int, float)) or isinstance(loss, bool):
            loss = None
        if 0 <= record["step"] <= MAX_STEP:  # a damaged line may say anything; steps are stored unsigned, 32 bits
            rows[(kind, record["step"])] = Metric(run=run, kind=kind, step=record["step"], loss=loss, values=record)
    return list(rows.values())


def checkpoint_register(run: Run, event: dict) -> Checkpoint | None:
    folder = Path(run.run_dir) / event.get("path", "")
    manifest = read_manifest(folder)
    if manifest is None:
        return None  # pruned since, or not complete: never registered
    checkpoint, _ = Checkpoint.objects.update_or_create(
        run=run, step=manifest.step,
        defaults={"path": str(folder), "manifest": finite(manifest.to_dict()), "size_bytes": _folder_size(folder),
                  "tokens_seen": manifest.tokens_seen})
    return checkpoint


def checkpoints_follow_retention(run: Run) -> None:
    """Drop the checkpoints whose folders the trainer's retention deleted. One a deployment was made from stays on
    record: the deployment's model repository holds its own copy of the weights, and its lineage must not break."""
    for checkpoint in run.checkpoints.filter(deployments__isnull=True):
        if read_manifest(checkpoint.path) is None:
            checkpoint.delete()


def profile_register(run: Run, event: dict) -> Profile:
    folder = Path(run.run_dir) / event.get("path", "")
    summary = finite(read_json(folder / "summary.json") or {})
    profile, _ = Profile.objects.update_or_create(run=run, name=event.get("name", folder.name),
                                                  defaults={"path": str(folder), "summary": summary})
    return profile


def _apply_event(run: Run, event: dict) -> None:
    kind = event.get("event")
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


@transaction.atomic
def run_ingest(run_id: int) -> Run:
    """Bring the database up to date with the run folder of run ``run_id``."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if not run.run_dir:
        return run
    state = dict(run.ingest_state or {})
    folder = Path(run.run_dir)

    metrics, offset = [], state.get("metrics_offset", 0)
    for offset, record in read_jsonl(folder / METRICS, offset):
        metrics.append(record)
    Metric.objects.bulk_create(_metric_rows(run, metrics), update_conflicts=True,
                               unique_fields=["run", "kind", "step"], update_fields=["loss", "values", "recorded_at"])
    state["metrics_offset"] = offset
    train_steps = [r["step"] for r in metrics if is_step_row(r) and 0 <= r["step"] <= MAX_STEP]
    if train_steps:
        run.last_step = max(run.last_step, *train_steps)

    offset, saved = state.get("events_offset", 0), False
    for offset, event in read_jsonl(folder / EVENTS, offset):
        _apply_event(run, event)
        saved = saved or event.get("event") == Event.CHECKPOINT_SAVED
        if event.get("event") in Event.MILESTONES:
            state["last_event"] = event["event"]
    state["events_offset"] = offset
    if saved:  # retention prunes when a checkpoint is saved
        checkpoints_follow_retention(run)

    run.ingest_state = state
    run.save()
    return run
