"""Whole weights → the serving layout: one state per tensor-parallel rank (Megatron's split).

    column-parallel (split along the output, dim 0): attn.q, attn.k, attn.v, the MLP's up and SwiGLU's gate (the
        dense MLP's, each routed expert's and the shared expert's): rank r holds heads [r·H/t, (r+1)·H/t),
        key/value heads [r·K/t, (r+1)·K/t), hidden units [r·F/t, (r+1)·F/t) of each MLP of width F; their biases
        and int8 scales (one per output row) are split the same way. Gate and up are split alike, so a rank's
        hidden unit j multiplies SiLU(gate_j) by up_j of the same whole-model unit.
    row-parallel (split along the input, dim 1): attn.out, each MLP's down: each rank's product is a partial sum;
        their biases and int8 scales (per output row) are whole on every rank.
    whole on every rank: embeddings, norms, the router, the shared expert's gate (one scalar per token), the head
        (a tied head is the embedding: not stored twice).
Query head h reads key/value head h // (H/K), so a rank's query heads read exactly the key/value heads it holds.
"""
from __future__ import annotations

import re

import torch

from trainer.contract import ModelSpec

from deploy.reduce import SCALE_SUFFIX

_COLUMN = re.compile(r"\.(attn\.[qkv]|up|gate)\.(weight|bias)$")  # not shared_gate: whole
_ROW = re.compile(r"\.(attn\.out|down)\.weight$")


def shard_problems(spec: ModelSpec, tp: int) -> list[str]:
    found = []
    if tp < 1:
        found.append(f"tensor_parallel={tp}: must be at least 1")
    elif spec.n_heads % tp or spec.kv_heads % tp or any(width % tp for _, width in _mlp_widths(spec)):
        widths = ", ".join(f"{what} {width}" for what, width in _mlp_widths(spec))
        found.append(f"tensor_parallel={tp} must divide n_heads={spec.n_heads}, kv_heads={spec.kv_heads} and the "
                     f"MLP widths ({widths}): choose a tensor_parallel that divides them all")
    return found


def _mlp_widths(spec: ModelSpec) -> list[tuple[str, int]]:
    """(what, width) of each kind of MLP the model has: each is split by hidden units."""
    widths = [("dense", spec.ffn)] if len(spec.moe_layers) < spec.n_layers else []
    if spec.is_moe:
        widths.append(("expert", spec.moe_ffn))
        if spec.shared_expert_ffn:
            widths.append(("shared expert", spec.shared_expert_ffn))
    return widths


def shard_state(state: dict[str, torch.Tensor], spec: ModelSpec, tp: int) -> list[dict[str, torch.Tensor]]:
    """``tp`` states, rank by rank; each tensor contiguous and owned (safetensors stores no views)."""
    problems = shard_problems(spec, tp)
    if problems:
        raise ValueError("; ".join(problems))
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    for name, tensor in state.items():
        if name == "head.weight" and spec.tied_embeddings:
            continue
        base = name.removesuffix(SCALE_SUFFIX)
        if _COLUMN.search(base):
            parts = tensor.chunk(tp, dim=0)
        elif _ROW.search(base) and not name.endswith(SCALE_SUFFIX):
            parts = tensor.chunk(tp, dim=1)
        else:
            parts = [tensor] * tp
        for shard, part in zip(shards, parts):
            shard[name] = part.contiguous().clone()
    return shards
