"""A checkpoint's weights alone, into a model of any plan: how a run starts from a checkpoint (``RunSpec.init_from``).

A resume restores everything its own run saved (weights, optimizer, random states). A run started from a checkpoint
takes only the weights, from a checkpoint of any plan and either engine, or one imported from Hugging Face, and
trains them with its own plan and a fresh optimizer from step 0. Weights are matched by the native parameter names,
which no plan changes (pipeline stages, tensor and expert parallel and FSDP keep them), so each rank fills only the
parameters and shards it holds:

    native DCP shards     read by DCP straight into this rank's shards (the model part only; DCP reshards)
    anything else         the whole state dict (``consolidated.checkpoint_state``: the consolidated file, or
                          DeepSpeed's files read back), each rank cutting its shards from the full tensors
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.checkpoint.consolidated import checkpoint_state
from trainer.contract import ModelSpec
from trainer.contract.manifest import FORMAT_DCP, CheckpointManifest, init_from_problem, read_manifest

_TIED_HEAD, _EMBED = "head.weight", "embed.tokens.weight"


class InitFromError(ValueError):
    """The checkpoint a run was told to start from cannot be used: the message says why and what to change."""


def source_manifest(folder: str | Path, model: ModelSpec) -> CheckpointManifest:
    """The manifest of the checkpoint to start from, refused when it is not a complete checkpoint or holds another
    model (the differing fields named)."""
    problem = init_from_problem(folder, model)
    if problem:
        raise InitFromError(problem)
    return read_manifest(folder)


def _named_distinct(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Each parameter once, by the name its full tensor has in a checkpoint (a pipeline's last stage holds a tied
    head under the head's name; the checkpoint has it under the embedding's)."""
    seen: set[int] = set()
    tied = getattr(getattr(module, "spec", None), "tied_embeddings", False)
    for name, p in module.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        yield (_EMBED if name == _TIED_HEAD and tied else name), p


@torch.no_grad()
def copy_full_weights(modules: list[nn.Module], state: dict[str, torch.Tensor]) -> None:
    """Fill every parameter this rank holds (whole, or its DTensor shards) from the full tensors of ``state``."""
    missing = [name for m in modules for name, _ in _named_distinct(m) if name not in state]
    if missing:
        raise InitFromError(f"the checkpoint lacks {len(missing)} of the model's weights ({', '.join(missing[:4])}"
                            f"{', …' if len(missing) > 4 else ''})")
    for m in modules:
        for name, p in _named_distinct(m):
            full = state[name]
            if tuple(full.shape) != tuple(p.shape):
                raise InitFromError(f"the checkpoint's {name} has shape {tuple(full.shape)}, the model's "
                                    f"{tuple(p.shape)}")
            if isinstance(p, DTensor):
                # every rank holds the full tensor: each cuts its own shard, no communication
                local = distribute_tensor(full.to(p.device, p.dtype), p.device_mesh, p.placements, src_data_rank=None)
                p.to_local().copy_(local.to_local())
            else:
                p.copy_(full)
        if hasattr(m, "reset_buffers"):
            m.reset_buffers()


def load_dcp_weights(folder: Path, modules: list[nn.Module]) -> None:
    """The model part of a native checkpoint read into this rank's shards (the optimizer's part is left unread)."""
    state: dict[str, Any] = {}
    for m in modules:
        state.update(get_model_state_dict(m))
    loaded = {"model": state}
    dcp.load(loaded, checkpoint_id=str(folder))
    for m in modules:
        set_model_state_dict(m, loaded["model"], options=StateDictOptions(strict=False))


def load_weights(folder: str | Path, modules: list[nn.Module], model: ModelSpec) -> CheckpointManifest:
    """Collective for the native engine: ``modules`` (already parallelised) get the checkpoint's weights."""
    folder = Path(folder)
    manifest = source_manifest(folder, model)
    if manifest.format == FORMAT_DCP:
        load_dcp_weights(folder, modules)
    else:
        copy_full_weights(modules, full_weights(folder, manifest))
    return manifest


def full_weights(folder: Path, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    """Every weight of the checkpoint, whole and fp32, by native names (the tied head under both names)."""
    state = checkpoint_state(folder, manifest)
    if _EMBED in state and _TIED_HEAD not in state:
        state[_TIED_HEAD] = state[_EMBED]
    return state
