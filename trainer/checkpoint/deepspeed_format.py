"""DeepSpeed's checkpoint files read back as one fp32 state dict under the native model's parameter names.

    ZeRO 1–3        DeepSpeed's zero-to-fp32 functions stitch every rank's fp32 master partitions into whole tensors
    ZeRO 0          the module states DeepSpeed saves whole (mp_rank_00_model_states.pt)
    pipeline        one file per layer (layer_XX-model_states.pt), each saved whole by the stage holding it
    mixture of      the module states (every non-expert weight, whole at ZeRO ≤ 2) and one file per expert, named
    experts         with global expert ids

Reading needs torch (and deepspeed's zero_to_fp32 for ZeRO ≥ 1), never the training loop, so consolidation and
deployment can use it on any machine.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from trainer.contract import ModelSpec
from trainer.contract.manifest import read_manifest


def consolidated_state(folder: Path, zero_stage: int, model: ModelSpec | None = None,
                       pp: int | None = None) -> dict[str, torch.Tensor]:
    """The whole fp32 state dict of a DeepSpeed checkpoint folder, by the module's (native) parameter names."""
    folder = Path(folder)
    if model is None or pp is None:  # from the manifest (while saving it is not written yet: the saver passes both)
        manifest = read_manifest(folder)
        if manifest is None:
            raise FileNotFoundError(f"{folder} has no manifest.json: not a complete checkpoint")
        model, pp = manifest.model_spec(), int(manifest.plan.get("pp", 1))
    if pp > 1:  # pipeline: each layer saved whole in layer_XX-model_states.pt (fp32 training: the weights)
        return pipeline_state(folder, model)
    if model.is_moe:
        return _moe_state(folder)
    if zero_stage == 0:
        states = torch.load(folder / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        return {k: v.float() for k, v in states["module"].items()}
    # DeepSpeed is needed only here, to stitch its own ZeRO partitions: reading any other checkpoint needs none
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


_LAYER_FILE = re.compile(r"^layer_(\d+)-model_states\.pt$")


def native_name(spec: ModelSpec, layer: int, name: str) -> str:
    """Pipeline layer ``layer``'s parameter ``name`` → the native GPT's name."""
    if layer == 0:
        return "embed." + name
    if layer <= spec.n_layers:
        return f"layers.{layer - 1}.{name}"
    if layer == spec.n_layers + 1:
        return "norm." + name
    return ("embed." if spec.tied_embeddings else "head.") + name  # a tied head is a second copy of the embedding


def pipeline_state(folder: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The whole state dict from DeepSpeed's per-layer files (each layer is saved whole by the stage holding it)."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.iterdir()):
        m = _LAYER_FILE.match(path.name)
        if m:
            layer = int(m.group(1))
            for name, tensor in torch.load(path, map_location="cpu", weights_only=False).items():
                state[native_name(spec, layer, name)] = tensor.float()
    if spec.tied_embeddings:
        state["head.weight"] = state["embed.tokens.weight"]
    return state
