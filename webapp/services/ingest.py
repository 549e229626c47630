"""Reading a run folder into the database: events move the status, metrics become rows, checkpoints and profiles are
registered. Idempotent and incremental: byte offsets into the JSONL files are kept on the run, a torn last line is
left for next time, and reading a record twice changes nothing (unique constraints, ignore on conflict)."""
from pathlib import Path

from django.db import transaction

from trainer.contract.runfolder import EVENTS, MANIFEST, METRICS, read_json, read_jsonl

from ..models import Checkpoint, Metric, Profile, Run, RunStatus


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _metric_rows(run: Run, records: list[dict]) -> list[Metric]:
    rows = []
    for record in records:
        step = record.get("step")
        if not isinstance(step, int) or step < 0:
            continue
        if "val_loss" in record:
            rows.append(Metric(run=run, kind="val", step=step, loss=record["val_loss"], values=record))
        elif "loss" in record:
            rows.append(Metric(run=run, kind="train", step=step, loss=record["loss"], values=record))
    return rows


def checkpoint_register(run: Run, event: dict) -> Checkpoint | None:
    folder = Path(run.run_dir) / event.get("path", "")
    manifest = read_json(folder / MANIFEST)
    if manifest is None:
        return None  # pruned since, or not complete: never registered
    checkpoint, _ = Checkpoint.objects.update_or_create(
        run=run, step=manifest.get("step", event.get("step", 0)),
        defaults={"path": str(folder), "manifest": manifest, "size_bytes": _folder_size(folder),
                  "tokens_seen": manifest.get("tokens_seen", event.get("tokens_seen", 0))})
    return checkpoint


def profile_register(run: Run, event: dict) -> Profile:
    folder = Path(run.run_dir) / event.get("path", "")
    summary = read_json(folder / "summary.json") or {}
    profile, _ = Profile.objects.update_or_create(run=run, name=event.get("name", folder.name),
                                                  defaults={"path": str(folder), "summary": summary})
    return profile


def _apply_event(run: Run, event: dict) -> None:
    kind = event.get("event")
    if kind == "started" and run.status == RunStatus.SUBMITTED:
        run.transition(RunStatus.RUNNING)
    elif kind == "checkpoint_saved":
        checkpoint_register(run, event)
    elif kind == "profile_written":
        profile_register(run, event)
    elif kind == "finished" and run.can_transition(RunStatus.COMPLETED):
        run.transition(RunStatus.COMPLETED, f"finished at step {event.get('step')}")
    elif kind == "failed" and run.can_transition(RunStatus.FAILED):
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
    Metric.objects.bulk_create(_metric_rows(run, metrics), ignore_conflicts=True)
    state["metrics_offset"] = offset
    train_steps = [r["step"] for r in metrics if "loss" in r and isinstance(r.get("step"), int)]
    if train_steps:
        run.last_step = max(run.last_step, *train_steps)

    offset = state.get("events_offset", 0)
    for offset, event in read_jsonl(folder / EVENTS, offset):
        _apply_event(run, event)
        if event.get("event") in ("started", "finished", "failed", "stopped"):
            state["last_event"] = event["event"]
    state["events_offset"] = offset

    run.ingest_state = state
    run.save()
    return run
