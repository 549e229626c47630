"""DeepSpeed checkpoints in the run folder's layout, with the native engine's manifest discipline:

    checkpoints/step-<n>/
      mp_rank_00_model_states.pt, *_optim_states.pt     DeepSpeed's own files (ZeRO shards per rank)
      rng-rank<r>.pt                                     this rank's random-number generator states
      consolidated.safetensors                           the fp32 weights under the native names (rank 0)
      manifest.json                                      written last by rank 0: without it the folder is never used

Consolidation reads DeepSpeed's files back by native names (trainer.checkpoint.deepspeed_format) right after the
save, so every DeepSpeed checkpoint carries weights that generation and deployment read without DeepSpeed.
"""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from trainer.checkpoint.consolidated import write_consolidated
from trainer.checkpoint.dcp import check_same_model
from trainer.checkpoint.deepspeed_format import consolidated_state
from trainer.checkpoint.rng import restore_rng, save_rng
from trainer.contract import ParallelPlan, RunSpec
from trainer.contract.manifest import CONSOLIDATED, CheckpointManifest, complete_checkpoints, read_manifest, step_dir
from trainer.contract.runfolder import CHECKPOINTS


def save(engine, run_dir: Path, manifest: CheckpointManifest, spec: RunSpec, keep: int) -> Path:
    """Collective. Rank 0 consolidates, then writes the manifest last, then prunes to ``keep``."""
    rank = dist.get_rank()
    folder = step_dir(run_dir, manifest.step)
    if rank == 0 and folder.exists():
        shutil.rmtree(folder)  # a leftover incomplete attempt at this step
    dist.barrier()
    engine.save_checkpoint(str(Path(run_dir) / CHECKPOINTS), tag=folder.name, save_latest=False)
    save_rng(folder, rank)
    dist.barrier()  # every shard is on disk before rank 0 reads them back
    if rank == 0:
        write_consolidated(consolidated_state(folder, spec.plan.zero_stage, spec.model, spec.plan.pp),
                           folder / CONSOLIDATED)
        replace(manifest, zero_stage=spec.plan.zero_stage, consolidated=CONSOLIDATED).write(folder)
        for _, old in complete_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return folder


def load(engine, folder: Path, rank: int, plan: ParallelPlan, model: dict) -> CheckpointManifest:
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no manifest.json: it is incomplete")
    check_same_model(folder, manifest, model)
    path, _ = engine.load_checkpoint(str(folder.parent), tag=folder.name, load_optimizer_states=True,
                                     load_lr_scheduler_states=False)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load {folder}")
    if manifest.same_layout(plan):
        restore_rng(folder, rank)
    return manifest
