"""A checkpoint describes itself: ``checkpoints/step-<n>/manifest.json``, and how to find complete checkpoints.

The manifest is written last (atomically, by rank 0) after every rank's shards are on disk, so a folder without one
is an attempt that died part-way and is never used. The web app, the workers and deployment read checkpoints
through this module alone; only the trainer writes them, and deployment's import of weights trained elsewhere
(format ``consolidated``: the weights file and this manifest, nothing to resume from). Standard library only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from trainer.contract.runfolder import CHECKPOINTS, MANIFEST, read_json, write_json_atomic
from trainer.contract.specjson import SCHEMA_VERSION
from trainer.contract.specs import ModelSpec, ParallelPlan

FORMAT_DCP = "torch.distributed.checkpoint"  # the native engine: every rank's shards, resharded on load
FORMAT_DEEPSPEED = "deepspeed"               # DeepSpeed's own files (ZeRO partitions per rank)
FORMAT_CONSOLIDATED = "consolidated"         # the consolidated file alone: weights only, no optimizer state (imports)
CONSOLIDATED = "consolidated.safetensors"    # whole fp32 weights under the native names, any engine
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class CheckpointManifest:
    step: int
    format: str
    tokens_seen: int
    model: dict[str, Any]          # ModelSpec.to_dict()
    plan: dict[str, Any]           # ParallelPlan.to_dict() of the run that saved it
    world_size: int
    tokenizer: str                 # path of the dataset's tokenizer.json
    seed: int
    run: str = ""
    loss_scaler: Optional[dict[str, Any]] = None  # native engine: the fp16 loss scaler's state
    zero_stage: Optional[int] = None             # DeepSpeed: the ZeRO stage of its partitions
    consolidated: Optional[str] = None           # the consolidated weights' file name, when written at save
    started_from: Optional[str] = None           # lineage: the checkpoint folder the run's weights started from
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CheckpointManifest":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_dict(self.model)

    def same_layout(self, plan: ParallelPlan) -> bool:
        """Saved by this very plan on as many ranks: random-number states can then be restored rank by rank."""
        # Compared as specs, not as dicts: a plan an older schema wrote lacks the fields added since.
        return self.world_size == plan.world_size and ParallelPlan.from_dict(self.plan, validate=False) == plan

    def write(self, folder: str | Path) -> None:
        write_json_atomic(Path(folder) / MANIFEST, self.to_dict())


# Fields that change how a model trains, not what its weights mean: a run started from a checkpoint may set its own.
TRAINING_ONLY_FIELDS = ("name", "dropout", "aux_loss_coef", "capacity_factor")


def model_differences(saved: dict[str, Any], wanted: ModelSpec) -> list[str]:
    """The model fields in which ``wanted`` differs from a checkpoint's model (its manifest's ``model``), compared
    as specs so that a manifest of an older schema compares by its defaults. Training-only fields may differ, and
    so may seq_len when both use rotary positions (their weights hold no table of positions)."""
    have = ModelSpec.from_dict(saved, validate=False)
    skip = set(TRAINING_ONLY_FIELDS)
    if have.positions == "rope" and wanted.positions == "rope":
        skip.add("seq_len")
    return [f.name for f in fields(ModelSpec)
            if f.name not in skip and getattr(have, f.name) != getattr(wanted, f.name)]


def init_from_problem(checkpoint: str | Path, model: ModelSpec) -> str:
    """Why a run of ``model`` cannot start from the checkpoint folder ``checkpoint`` (RunSpec.init_from), or ''."""
    folder = Path(checkpoint).expanduser()
    manifest = read_manifest(folder) if folder.is_dir() else None
    if manifest is None:
        return (f"init_from.checkpoint {folder} has no readable manifest.json: it is not a complete checkpoint "
                f"(give <run>/checkpoints/step-<n>, or a folder python -m deploy import-hf wrote)")
    differ = model_differences(manifest.model, model)
    if differ:
        saved = ModelSpec.from_dict(manifest.model, validate=False)
        detail = ", ".join(f"{k}: checkpoint {getattr(saved, k)!r}, run {getattr(model, k)!r}" for k in differ)
        return (f"the run's model differs from the checkpoint's in {', '.join(differ)} ({detail}): give the run "
                f"the model spec of {folder / MANIFEST}")
    return ""


def read_manifest(folder: str | Path) -> CheckpointManifest | None:
    """The manifest of a checkpoint folder, or None when the folder is incomplete, pruned or not a checkpoint."""
    data = read_json(Path(folder) / MANIFEST)
    if not isinstance(data, dict):
        return None
    try:
        return CheckpointManifest.from_dict(data)
    except TypeError:  # a field missing: not a manifest this version wrote
        return None


def step_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step-{step}"


def _step_folders(run_dir: str | Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), d) for d in root.iterdir() if (m := _STEP_DIR.match(d.name)))


def complete_checkpoints(run_dir: str | Path, format: str | None = None) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint whose manifest exists (of ``format``, if given), oldest first."""
    found = []
    for step, folder in _step_folders(run_dir):
        if format is None and (folder / MANIFEST).is_file():
            found.append((step, folder))
        elif format is not None and (m := read_manifest(folder)) is not None and m.format == format:
            found.append((step, folder))
    return found


def latest_checkpoint(run_dir: str | Path, format: str | None = None) -> Path | None:
    found = complete_checkpoints(run_dir, format)
    return found[-1][1] if found else None


def incomplete_before(run_dir: str | Path, step: int) -> list[Path]:
    """Folders of saves that died part-way before ``step``: never to be used, safe to delete."""
    return [d for s, d in _step_folders(run_dir) if s < step and not (d / MANIFEST).is_file()]
