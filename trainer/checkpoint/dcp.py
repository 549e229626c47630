"""The native engine's checkpoints in torch.distributed.checkpoint (DCP) format: every rank writes its own shards,
any plan reads them.

    checkpoints/step-<n>/
      *.distcp, .metadata      model and optimizer state by parameter name (DCP reshards on load: dp 2 → 1,
                               FSDP → DDP, tp splits, pipeline stages all map by name)
      rng-rank<r>.pt           this rank's random-number generator states
      manifest.json            written last, atomically, by rank 0 (trainer.contract.manifest)

Parameter names do not depend on the plan (trainer.model), so a checkpoint from one plan loads into another.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from trainer.checkpoint.rng import restore_rng, save_rng
from trainer.contract import ParallelPlan
from trainer.contract.manifest import (CheckpointManifest, complete_checkpoints, incomplete_before, read_manifest,
                                       step_dir)

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

# A tied LM head is one parameter with two names; optimizer state is filed under the embedding's. A pipeline's
# last stage holds the head alone and looks for it under the head's name, so both names are written.
_TIED = ("embed.tokens.weight", "head.weight")


def _tied_aliases(module: nn.Module, optim: dict[str, Any]) -> dict[str, Any]:
    embed, head = getattr(module, "embed", None), getattr(module, "head", None)
    if embed is None or head is None or head.weight is not embed.tokens.weight:
        return {}
    aliases = {}
    for key, value in optim.items():
        for section in ("state.", "param_groups."):
            if key.startswith(section + _TIED[0] + "."):
                aliases[section + _TIED[1] + key[len(section + _TIED[0]):]] = value
    return aliases


def _state(modules: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> tuple[dict[str, Any], set[str]]:
    """The state to save or load into, and the alias keys added for tied weights."""
    model, optim, aliases = {}, {}, set()
    for module, opt in zip(modules, optimizers):
        model.update(get_model_state_dict(module))
        mine = get_optimizer_state_dict(module, opt, options=_OPTIONS)
        extra = {k: v for k, v in _tied_aliases(module, mine).items() if k not in mine}
        aliases |= set(extra)
        optim.update(mine)
        optim.update(extra)
    return {"model": model, "optim": optim}, aliases


def save_checkpoint(run_dir: Path, manifest: CheckpointManifest, modules: list[nn.Module],
                    optimizers: list[torch.optim.Optimizer], rank: int, keep: int) -> Path:
    """Save on every rank (collective); rank 0 writes the manifest last, then prunes to the newest ``keep``."""
    folder = step_dir(run_dir, manifest.step)
    if rank == 0 and folder.exists():
        shutil.rmtree(folder)  # a leftover incomplete attempt at this step
    dist.barrier()
    dcp.save(_state(modules, optimizers)[0], checkpoint_id=str(folder))
    save_rng(folder, rank)
    dist.barrier()  # every shard is on disk before the manifest vouches for them
    if rank == 0:
        manifest.write(folder)
        for _, old in complete_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for old in incomplete_before(run_dir, manifest.step):  # saves that died part-way; never to be used
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return folder


def check_same_model(folder: Path, manifest: CheckpointManifest, model: dict[str, Any]) -> None:
    """Refuse a checkpoint of another model, naming the fields that differ."""
    if manifest.model != model:
        changed = sorted(k for k, v in model.items() if manifest.model.get(k) != v)
        raise ValueError(f"{folder} holds a different model (changed: {', '.join(changed)}): resume with the "
                         f"model spec it was written for, or start a new run")


def load_checkpoint(folder: Path, modules: list[nn.Module], optimizers: list[torch.optim.Optimizer], rank: int,
                    plan: ParallelPlan) -> CheckpointManifest:
    """Load into the already-parallelised ``modules`` and optimizers; return the manifest.

    RNG states come back only when the checkpoint was saved by this very plan; otherwise each rank keeps the fresh
    seed the loop gives it."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no manifest.json: it is incomplete")
    check_same_model(folder, manifest, modules[0].spec.to_dict())
    state, aliases = _state(modules, optimizers)
    dcp.load(state, checkpoint_id=str(folder))
    for key in aliases:
        state["optim"].pop(key)
    for module, opt in zip(modules, optimizers):
        set_model_state_dict(module, state["model"], options=StateDictOptions(strict=False))
        set_optimizer_state_dict(module, opt, state["optim"], options=_OPTIONS)
    if manifest.same_layout(plan):
        restore_rng(folder, rank)
    return manifest
