"""DeepSpeed checkpoints in the run folder's layout, with the native engine's manifest discipline:

    checkpoints/step-<n>/
      mp_rank_00_model_states.pt, *_optim_states.pt     DeepSpeed's own files (ZeRO shards per rank)
      rng-rank<r>.pt                                     this rank's random-number generator states
      consolidated.safetensors                           the fp32 weights under the native names (rank 0)
      manifest.json                                      written last by rank 0: without it the folder is never used

Consolidation uses DeepSpeed's zero-to-fp32 functions (ZeRO 1–3: the fp32 master partitions of every rank
stitched into whole tensors), or the module states DeepSpeed saves whole at stage 0.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.checkpoint import _rng_state, _set_rng_state, complete_checkpoints, step_dir
from trainer.consolidated import CONSOLIDATED, write_consolidated
from trainer.contract.runfolder import CHECKPOINTS, MANIFEST, read_json, write_json_atomic
from trainer.contract import RunSpec
from trainer.contract.specjson import SCHEMA_VERSION

FORMAT = "deepspeed"


def latest(run_dir: Path) -> Path | None:
    found = [(s, f) for s, f in complete_checkpoints(run_dir) if (read_json(f / MANIFEST) or {}).get("format") == FORMAT]
    return found[-1][1] if found else None


def same_layout(folder: Path, spec: RunSpec) -> bool:
    manifest = read_json(folder / MANIFEST) or {}
    return manifest.get("world_size") == spec.plan.world_size and manifest.get("plan") == spec.plan.to_dict()


def save(engine, run_dir: Path, step: int, manifest: dict[str, Any], spec: RunSpec) -> Path:
    """Collective. Rank 0 consolidates, then writes the manifest last, then prunes to keep_checkpoints."""
    rank = dist.get_rank()
    folder = step_dir(run_dir, step)
    if rank == 0 and folder.exists():
        shutil.rmtree(folder)  # a leftover incomplete attempt at this step
    dist.barrier()
    engine.save_checkpoint(str(Path(run_dir) / CHECKPOINTS), tag=folder.name, save_latest=False)
    torch.save(_rng_state(), folder / f"rng-rank{rank}.pt")
    dist.barrier()  # every shard is on disk before rank 0 reads them back
    if rank == 0:
        write_consolidated(consolidated_state(folder, spec.plan.zero_stage, spec), folder / CONSOLIDATED)
        write_json_atomic(folder / MANIFEST, {"schema_version": SCHEMA_VERSION, "step": step, "format": FORMAT,
                                              "zero_stage": spec.plan.zero_stage, **manifest,
                                              "consolidated": CONSOLIDATED})
        for _, old in complete_checkpoints(run_dir)[:-spec.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return folder


def load(engine, folder: Path, rank: int, same_layout: bool) -> dict[str, Any]:
    manifest = read_json(folder / MANIFEST)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no {MANIFEST}: it is incomplete")
    path, _ = engine.load_checkpoint(str(folder.parent), tag=folder.name, load_optimizer_states=True,
                                     load_lr_scheduler_states=False)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load {folder}")
    rng = folder / f"rng-rank{rank}.pt"
    if same_layout and rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    return manifest


def consolidated_state(folder: Path, zero_stage: int, spec: RunSpec | None = None) -> dict[str, torch.Tensor]:
    """The whole fp32 state dict of a DeepSpeed checkpoint folder, by the module's (native) parameter names."""
    folder = Path(folder)
    manifest = read_json(folder / MANIFEST) or {}  # absent while saving: then ``spec`` says what was saved
    pp = (spec.plan.pp if spec is not None else manifest.get("plan", {}).get("pp", 1))
    if pp > 1:  # pipeline: each layer saved whole in layer_XX-model_states.pt (fp32 training: the weights)
        from trainer.ds.pipeline import consolidated_pipeline_state
        from trainer.contract import ModelSpec

        model = spec.model if spec is not None else ModelSpec.from_dict(manifest["model"])
        return consolidated_pipeline_state(folder, model)
    model = spec.model if spec is not None else None
    if (model is not None and model.is_moe) or manifest.get("model", {}).get("n_experts", 0) > 1:
        return _moe_state(folder)
    if zero_stage == 0:
        states = torch.load(folder / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        return {k: v.float() for k, v in states["module"].items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(folder.parent), tag=folder.name)


_EXPERT = re.compile(r"^(layers\.\d+\.mlp)\.moe\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.(.+)$")
_GATE = re.compile(r"^(layers\.\d+\.mlp)\.moe\.deepspeed_moe\.gate\.wg\.weight$")
_EXPERT_FILE = re.compile(r"^layer_\d+_expert_\d+_mp_rank_\d+_model_states\.pt$")


def native_moe_name(name: str) -> str:
    """DeepSpeed MoE names → the native layer's: the gate is the router, expert i (global id) is experts.i."""
    if m := _EXPERT.match(name):
        return f"{m.group(1)}.experts.{m.group(2)}.{m.group(3)}"
    if m := _GATE.match(name):
        return f"{m.group(1)}.router.weight"
    return name


def _moe_state(folder: Path) -> dict[str, torch.Tensor]:
    """zero-to-fp32 does not read DeepSpeed's per-expert files, so a MoE checkpoint is put together from the
    module states (every non-expert weight, saved whole at ZeRO ≤ 2) and one file per expert (global ids in the
    names). The module's own weights are the trained values in fp32 training; with bf16 or fp16 they are the
    16-bit copies, not the fp32 masters."""
    module = torch.load(folder / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    state = {native_moe_name(k): v.float() for k, v in module.items()}
    for path in sorted(folder.iterdir()):
        if _EXPERT_FILE.match(path.name):
            for k, v in torch.load(path, map_location="cpu", weights_only=False).items():
                state[native_moe_name(k)] = v.float()
    return state
