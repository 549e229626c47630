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

import re
import shutil
from dataclasses import replace
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.utils import groups

from trainer.checkpoint.consolidated import write_consolidated
from trainer.checkpoint.dcp import check_same_model
from trainer.checkpoint.deepspeed_format import consolidated_state, native_moe_name, native_name
from trainer.checkpoint.rng import restore_rng, save_rng
from trainer.checkpoint.weights import InitFromError, full_weights, source_manifest
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


_PIPE_LAYER = re.compile(r"^(\d+)\.(.+)$")
_LOCAL_EXPERT = re.compile(r"^(.+\.deepspeed_experts\.)(\d+)(\..+)$")


def _native_name(name: str, spec: RunSpec, first_expert: int) -> str:
    """The engine module's parameter name → the native GPT's: pipeline layers by their index (a tied embedding is
    DeepSpeed's tied module), MoE layers by trainer.checkpoint.deepspeed_format's map, this rank's local experts by
    their global ids."""
    if spec.plan.pp > 1:
        if name.startswith("tied_modules.embed."):
            return "embed." + name[len("tied_modules.embed."):]
        m = _PIPE_LAYER.match(name)
        return native_name(spec.model, int(m.group(1)), m.group(2)) if m else name
    if m := _LOCAL_EXPERT.match(name):
        name = f"{m.group(1)}{first_expert + int(m.group(2))}{m.group(3)}"
    return native_moe_name(name)


def load_weights(engine, folder: Path, spec: RunSpec) -> CheckpointManifest:
    """Collective: the checkpoint's weights (any plan, either engine, or an import) into the built engine, as
    DeepSpeed's own module-only load does: the module's parameters written (ZeRO-3: gathered, rank 0's values kept),
    then the optimizer's fp32 master copies refreshed from them. The optimizer's state stays fresh."""
    manifest = source_manifest(folder, spec.model)
    state = full_weights(folder, manifest)
    first_expert = 0
    if spec.model.is_moe and spec.plan.ep > 1:
        ep_rank = groups._get_expert_parallel_rank(groups._get_max_expert_size_name())
        first_expert = ep_rank * (spec.model.n_experts // spec.plan.ep)
    module = engine.module
    gathered = list(module.parameters()) if engine.zero_optimization_partition_weights() else []
    with deepspeed.zero.GatheredParameters(gathered, modifier_rank=0), torch.no_grad():
        for name, p in module.named_parameters():
            native = _native_name(name, spec, first_expert)
            if native not in state:
                raise InitFromError(f"the checkpoint {folder} has no weight {native} (the engine's {name})")
            p.copy_(state[native].to(p.dtype))
    if hasattr(engine.optimizer, "refresh_fp32_params"):
        engine.optimizer.refresh_fp32_params()
    return manifest
