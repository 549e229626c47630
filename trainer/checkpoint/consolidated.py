"""One file of whole fp32 weights under the native parameter names, whichever engine trained them.

    checkpoints/step-<n>/consolidated.safetensors

safetensors stores each tensor once, so a tied LM head (the same matrix as the token embedding) is written under
the embedding's name only and recorded in the file's metadata; ``load_consolidated`` puts the alias back so the
result loads into ``trainer.model.GPT`` with ``load_state_dict``. Deploy and generation read this one format.

    python -m trainer.checkpoint --checkpoint runs/<id>/checkpoints/step-<n>

writes it for a checkpoint of either engine (native DCP shards or DeepSpeed ZeRO shards); ``checkpoint_state`` reads
either into one state dict without writing anything.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trainer.checkpoint.deepspeed_format import consolidated_state
from trainer.contract import ModelSpec
from trainer.contract.manifest import CONSOLIDATED, FORMAT_DEEPSPEED, CheckpointManifest, read_manifest
from trainer.model import GPT, tie_weights

_TIED_KEY = "tied"


def write_consolidated(state: dict[str, torch.Tensor], path: str | Path) -> Path:
    tied: dict[str, str] = {}
    seen: dict[int, str] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        if key is not None and key in seen and torch.equal(state[seen[key]], tensor):
            tied[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        out[name] = tensor.detach().to("cpu").contiguous().clone()
    if "head.weight" in out and "embed.tokens.weight" in out and torch.equal(out["head.weight"],
                                                                             out["embed.tokens.weight"]):
        # zero-to-fp32 returns a tied matrix as two equal tensors: keep one
        tied["head.weight"] = "embed.tokens.weight"
        del out["head.weight"]
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(out, str(tmp), metadata={_TIED_KEY: json.dumps(tied)})
    tmp.replace(path)
    return path


def load_consolidated(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict in ``path`` (a consolidated.safetensors file, or a checkpoint folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONSOLIDATED
    state = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        tied = json.loads((f.metadata() or {}).get(_TIED_KEY, "{}"))
    for alias, name in tied.items():
        state[alias] = state[name]
    return state


def _manifest(folder: Path) -> CheckpointManifest:
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no manifest.json: not a complete checkpoint")
    return manifest


def checkpoint_state(folder: str | Path, manifest: CheckpointManifest | None = None) -> dict[str, torch.Tensor]:
    """Every rank's weights of a checkpoint of either engine, as one unsharded state dict by native names;
    ``manifest`` is the folder's own, when the caller has read it already (read here otherwise)."""
    folder = Path(folder)
    if (folder / CONSOLIDATED).is_file():
        return load_consolidated(folder)
    manifest = manifest or _manifest(folder)
    if manifest.format == FORMAT_DEEPSPEED:
        return consolidated_state(folder, int(manifest.zero_stage or 0))
    return dcp_state(folder, manifest.model_spec())


def consolidate(folder: str | Path) -> Path:
    """Write (once) and return the consolidated file of checkpoint ``folder``, from either engine's format."""
    folder = Path(folder)
    target = folder / CONSOLIDATED
    if target.is_file():
        return target
    _manifest(folder)
    return write_consolidated(checkpoint_state(folder), target)


def empty_model(spec: ModelSpec) -> GPT:
    """The whole model on the CPU, its weights uninitialised (cheaper than drawing the values a load replaces); the
    rotary tables, derived and never saved, computed."""
    with torch.device("meta"):
        model = GPT(spec)
    model.to_empty(device="cpu")
    tie_weights(model)
    model.reset_buffers()
    return model


def dcp_state(folder: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Every rank's DCP shards read into one unsharded model's state dict, in this one process (DCP reshards)."""
    state = {"model": empty_model(spec).state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state["model"]
