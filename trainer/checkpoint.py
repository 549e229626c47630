"""Checkpoints in torch.distributed.checkpoint (DCP) format: every rank writes its own shards, any plan reads them.

    checkpoints/step-<n>/
      *.distcp, .metadata      model and optimizer state by parameter name (DCP reshards on load: dp 2 → 1,
                               FSDP → DDP, tp splits, pipeline stages all map by name)
      rng-rank<r>.pt           this rank's random-number generator states
      manifest.json            written last, atomically, by rank 0: a folder without it is incomplete and never used

Parameter names do not depend on the plan (see trainer.model), so a checkpoint from one plan loads into another.
"""
from __future__ import annotations

import re
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

from trainer.contract.runfolder import CHECKPOINTS, MANIFEST, read_json, write_json_atomic
from trainer.contract.specjson import SCHEMA_VERSION

_STEP_DIR = re.compile(r"^step-(\d+)$")
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step-{step}"


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint whose manifest exists, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    if root.is_dir():
        for d in root.iterdir():
            m = _STEP_DIR.match(d.name)
            if m and (d / MANIFEST).is_file():
                found.append((int(m.group(1)), d))
    return sorted(found)


def _incomplete_before(run_dir: Path, step: int) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    return [d for d in root.iterdir() if (m := _STEP_DIR.match(d.name)) and int(m.group(1)) < step
            and not (d / MANIFEST).is_file()] if root.is_dir() else []


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


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


def save_checkpoint(run_dir: Path, step: int, modules: list[nn.Module], optimizers: list[torch.optim.Optimizer],
                    manifest: dict[str, Any], rank: int, keep: int) -> Path:
    """Save on every rank (collective); rank 0 writes the manifest last, then prunes to the newest ``keep``."""
    folder = step_dir(run_dir, step)
    if rank == 0 and folder.exists():
        shutil.rmtree(folder)  # a leftover incomplete attempt at this step
    dist.barrier()
    dcp.save(_state(modules, optimizers)[0], checkpoint_id=str(folder))
    torch.save(_rng_state(), folder / f"rng-rank{rank}.pt")
    dist.barrier()  # every shard is on disk before the manifest vouches for them
    if rank == 0:
        write_json_atomic(folder / MANIFEST, {"schema_version": SCHEMA_VERSION, "step": step,
                                              "format": "torch.distributed.checkpoint", **manifest})
        for _, old in complete_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for old in _incomplete_before(run_dir, step):  # saves that died part-way; never to be used
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return folder


def load_checkpoint(folder: Path, modules: list[nn.Module], optimizers: list[torch.optim.Optimizer] | None,
                    rank: int, same_world: bool) -> dict[str, Any]:
    """Load into the already-parallelised ``modules`` (and optimizers); return the manifest.

    RNG states come back only when the world layout is unchanged; otherwise each rank keeps its fresh seed."""
    manifest = read_json(Path(folder) / MANIFEST)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no {MANIFEST}: it is incomplete")
    spec = getattr(modules[0], "spec", None)
    if spec is not None and manifest.get("model") not in (None, spec.to_dict()):
        changed = sorted(k for k, v in spec.to_dict().items() if manifest["model"].get(k) != v)
        raise ValueError(f"{folder} holds a different model (changed: {', '.join(changed)}): resume with the "
                         f"model spec it was written for, or start a new run")
    optimizers = optimizers or []
    state, aliases = _state(modules, optimizers) if optimizers else ({"model": _state_model(modules)}, set())
    dcp.load(state, checkpoint_id=str(folder))
    for key in aliases:
        state["optim"].pop(key)
    for i, module in enumerate(modules):
        set_model_state_dict(module, state["model"], options=StateDictOptions(strict=False))
        if optimizers:
            set_optimizer_state_dict(module, optimizers[i], state["optim"], options=_OPTIONS)
    rng = Path(folder) / f"rng-rank{rank}.pt"
    if same_world and rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    return manifest


def _state_model(modules: list[nn.Module]) -> dict[str, Any]:
    model = {}
    for module in modules:
        model.update(get_model_state_dict(module))
    return model


def _rng_state() -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
