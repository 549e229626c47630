"""Smaller weights for deployment: keep fp32, cast to bf16 or fp16, or quantize the matrices to int8.

``reduce_state`` takes a state dict of native parameter names (trainer.checkpoint.consolidated) and returns the
reduced one; ``dequantize_state`` brings any reduced state back to fp32 under the same names, ready for
``GPT.load_state_dict``; ``state_bytes`` is what a state occupies.

int8 is weight-only, symmetric and per output channel. For a matrix W whose row r holds the weights of output r
(a Linear weight [out, in]; an embedding table [rows, C], whose rows are the logits of a tied head):

    s_r = max_i |W_ri| / 127          (s_r = 1 for a row of zeros, which then quantizes exactly)
    q_ri = clamp(round(W_ri / s_r), −127, 127)      stored as int8 under the weight's name
    Ŵ_ri = s_r · q_ri                               s stored as fp32 [rows] under ``<name>_scale``

Because |W_ri / s_r| ≤ 127 the clamp never cuts, so the only error is the rounding:
|W_ri − s_r·q_ri| = s_r·|W_ri/s_r − round(W_ri/s_r)| ≤ s_r / 2 per element. One scale per row rather than per
tensor because row ranges differ, and a row that shares the tensor's largest value would waste levels on the
others; a row's scale also factors out of its dot product (y_r = s_r · Σ_i q_ri x_i), so a kernel applies it once
per output. −128 is left out so that the range is symmetric and q = −q' stays representable. 1-D tensors (biases,
the gains of LayerNorm and RMSNorm) are a tiny share of the bytes and shift every activation they touch, so they
stay fp32. Every model family's matrices are taken alike: SwiGLU's gate, each expert's, the router, and a shared
expert's gate (one row, so one scale).

Tied weights: a state may hold ``head.weight`` as the very tensor of ``embed.tokens.weight`` (what
``load_consolidated`` and ``GPT.state_dict`` return for a tied head). Names that share one tensor are reduced once
and keep sharing the result, in the reduced state and again after ``dequantize_state``; so a tied head stays one
matrix (``state_bytes`` counts it once, ``write_consolidated`` stores it once) and both names stay present, which is
what ``load_state_dict`` of a tied GPT expects.
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch

REDUCTIONS = ("none", "bf16", "fp16", "int8")
SCALE_SUFFIX = "_scale"
INT8_LEVELS = 127  # q ∈ [−127, 127]

_CASTS = {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _check(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown weight reduction {reduction!r}: choose one of {', '.join(REDUCTIONS)}")


def _shared_key(tensor: torch.Tensor) -> Hashable:
    """Equal for two names that hold the same tensor (the same memory seen the same way), even when they are two
    tensor objects, as ``GPT.state_dict`` returns a tied head."""
    if tensor.numel() == 0 or tensor.device.type == "meta":
        return id(tensor)
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def _map_shared(state: dict[str, torch.Tensor],
                reduce_one: Callable[[str, torch.Tensor], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Apply ``reduce_one(name, tensor) → {suffix: tensor}`` once per distinct tensor; each name that shares it gets
    the same results under ``name + suffix``."""
    done: dict[Hashable, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = _shared_key(tensor)
        if key not in done:
            done[key] = reduce_one(name, tensor)
        for suffix, reduced in done[key].items():
            out[name + suffix] = reduced
    return out


def quantizes(name: str, tensor: torch.Tensor) -> bool:
    """int8 takes the matrices: 2-D floating tensors named ``….weight`` (Linear weights, embedding tables)."""
    return tensor.is_floating_point() and tensor.dim() == 2 and name.endswith(".weight")


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [rows, cols], s fp32 [rows]) with weight ≈ s[:, None] · q, |error| ≤ s/2 (module docstring)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_LEVELS, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)
    return q, scale


def _reduce_tensor(reduction: str) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    def reduce_one(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if not tensor.is_floating_point():
            return {"": tensor}
        if reduction == "int8":
            if quantizes(name, tensor):
                q, scale = quantize_rows(tensor)
                return {"": q, SCALE_SUFFIX: scale}
            return {"": tensor.float()}
        return {"": tensor.to(_CASTS[reduction])}
    return reduce_one


def reduce_state(state: dict[str, torch.Tensor], reduction: str) -> dict[str, torch.Tensor]:
    """The state under ``reduction`` (one of REDUCTIONS): "none" fp32, "bf16"/"fp16" every floating tensor cast,
    "int8" the matrices quantized per row with their scales beside them (module docstring). Non-floating tensors
    pass unchanged; names sharing one tensor share the result."""
    _check(reduction)
    return _map_shared(state, _reduce_tensor(reduction))


def _is_scale_of_int8(name: str, state: dict[str, torch.Tensor]) -> bool:
    base = name[:-len(SCALE_SUFFIX)]
    return name.endswith(SCALE_SUFFIX) and base in state and state[base].dtype == torch.int8


def dequantize_state(reduced: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any reduced state back to fp32 under the native names: Ŵ = s[:, None] · q for each int8 matrix with a scale,
    an upcast for the other floating tensors; the scales themselves are dropped."""
    def restore(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        scale = reduced.get(name + SCALE_SUFFIX)
        if tensor.dtype == torch.int8 and scale is not None:
            return {"": tensor.float() * scale.float()[:, None]}
        return {"": tensor.float() if tensor.is_floating_point() else tensor}

    kept = {name: t for name, t in reduced.items() if not _is_scale_of_int8(name, reduced)}
    return _map_shared(kept, restore)


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    """Σ numel · element_size over the distinct tensors: a tensor held under two names (a tied head) counts once."""
    distinct = {_shared_key(t): t for t in state.values()}
    return sum(t.numel() * t.element_size() for t in distinct.values())
