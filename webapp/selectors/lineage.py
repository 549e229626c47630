"""Where weights came from: a run's starting checkpoint, a checkpoint's chain of parents, imports and exports.

    run "small" started from checkpoint 7 (step 40 of run "base")
    checkpoint 9: step 100 of run "small" ← started from checkpoint 7: step 40 of run "base"
                  ← started from checkpoint 3: imported from /models/tiny-llama
"""
from django.db.models import QuerySet

from ..models import Checkpoint, CheckpointConversion, Run

MAX_DEPTH = 32  # a chain longer than this is cut (a cycle cannot be made: a run starts from an older checkpoint)


def conversions_visible_to(user) -> QuerySet:
    return CheckpointConversion.objects.visible_to(user).select_related("owner", "checkpoint")


def checkpoint_origin(checkpoint: Checkpoint) -> str:
    """One checkpoint in words: whose step it is, or where it was imported from."""
    if checkpoint.run_id is not None:
        run = checkpoint.run
        return f"checkpoint {checkpoint.pk}: step {checkpoint.step} of run {run.name!r} ({checkpoint.run_id})"
    if checkpoint.imported_from:
        return f"checkpoint {checkpoint.pk}: imported from {checkpoint.imported_from}"
    return f"checkpoint {checkpoint.pk}: registered from {checkpoint.path}"


def _spec_source(run: Run) -> str:
    return ((run.spec or {}).get("init_from") or {}).get("checkpoint", "")


def run_started_from(run: Run) -> str:
    """"started from checkpoint …" for a run that starts from a checkpoint's weights; '' for fresh weights."""
    if run.init_from_id is not None:  # the run's selector joins init_from and its run
        return f"started from {checkpoint_origin(run.init_from)}"
    folder = _spec_source(run)
    return f"started from the checkpoint folder {folder} (no longer on record)" if folder else ""


def checkpoint_lineage(checkpoint: Checkpoint) -> list[dict]:
    """The checkpoint and its parents, newest first: each {"checkpoint": id or None, "text": in words}."""
    chain, seen = [], set()
    current: Checkpoint | None = checkpoint
    while current is not None and current.pk not in seen and len(chain) < MAX_DEPTH:
        seen.add(current.pk)
        chain.append({"checkpoint": current.pk, "text": checkpoint_origin(current)})
        run = (Run.objects.filter(pk=current.run_id).select_related("init_from__run").first()
               if current.run_id else None)
        if run is None:
            break
        if run.init_from is None:
            if folder := _spec_source(run):
                chain.append({"checkpoint": None, "text": f"started from the checkpoint folder {folder}"})
            break
        current = run.init_from
    return chain
