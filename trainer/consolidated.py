"""One file of whole fp32 weights under the native parameter names, whichever engine trained them.

    checkpoints/step-<n>/consolidated.safetensors

safetensors stores each tensor once, so a tied LM head (the same matrix as the token embedding) is written under
the embedding's name only and recorded in the file's metadata; ``load_consolidated`` puts the alias back so the
result loads into ``trainer.model.GPT`` with ``load_state_dict``. Deploy and generation read this one format.

    python -m trainer.consolidated --checkpoint runs/<id>/checkpoints/step-<n>

writes it for a checkpoint of either engine (native DCP shards or DeepSpeed ZeRO shards).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

from trainer.contract.runfolder import MANIFEST, read_json

CONSOLIDATED = "consolidated.safetensors"
_TIED_KEY = "tied"


def write_consolidated(state: dict[str, torch.Tensor], path: str | Path) -> Path:
    from safetensors.torch import save_file

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
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = path / CONSOLIDATED
    state = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        tied = json.loads((f.metadata() or {}).get(_TIED_KEY, "{}"))
    for alias, name in tied.items():
        state[alias] = state[name]
    return state


def consolidate(folder: str | Path) -> Path:
    """Write (once) and return the consolidated file of checkpoint ``folder``, from either engine's format."""
    folder = Path(folder)
    target = folder / CONSOLIDATED
    if target.is_file():
        return target
    manifest = read_json(folder / MANIFEST)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no {MANIFEST}: not a complete checkpoint")
    if manifest.get("format") == "deepspeed":
        from trainer.ds.checkpoint import consolidated_state

        state = consolidated_state(folder, int(manifest.get("zero_stage", 0)))
    else:
        state = _dcp_state(folder, manifest)
    return write_consolidated(state, target)


def _dcp_state(folder: Path, manifest: dict) -> dict[str, torch.Tensor]:
    """Every rank's DCP shards read into one unsharded model's state dict (DCP reshards)."""
    import torch.distributed.checkpoint as dcp

    from trainer.model import GPT, tie_weights
    from trainer.contract import ModelSpec

    with torch.device("meta"):
        model = GPT(ModelSpec.from_dict(manifest["model"]))
    model.to_empty(device="cpu")
    tie_weights(model)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    return state["model"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.consolidated", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoints/step-<n> folder")
    print(consolidate(parser.parse_args(argv).checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
