"""FLOPs per token and per step (docs/formulas.md, FLOPs).

Model FLOPs per token (PaLM appendix B): 6·N + 12·L·h·s, with N the parameters a token multiplies by (block weight
matrices, k of E experts, and the V·h head, tied or not; embedding lookups, biases and LayerNorms are O(h) and left
out) and 12·L·h·s the attention score and value products (forward 4·s·h per layer, backward twice that), counted over
the full s×s square as PaLM does. Hardware FLOPs add recomputation: full recompute runs each block's forward again
(2·N_blocks + 4·L·h·s), selective recompute the attention core only (4·L·h·s).
"""
from __future__ import annotations

from trainer.planner.estimate.params import count
from trainer.contract import ModelSpec


def attention_flops_per_token(model: ModelSpec) -> int:
    return 12 * model.n_layers * model.d_model * model.seq_len


def model_flops_per_token(model: ModelSpec) -> int:
    return 6 * count(model).matmul_per_token + attention_flops_per_token(model)


def recompute_flops_per_token(model: ModelSpec, checkpointing: str) -> int:
    attention_forward = 4 * model.n_layers * model.d_model * model.seq_len
    if checkpointing == "full":
        blocks = count(model).matmul_per_token - model.vocab_size * model.d_model
        return 2 * blocks + attention_forward
    if checkpointing == "selective":
        return attention_forward
    return 0


def narayanan_flops_per_step(model: ModelSpec, global_batch: int, full_recompute: bool) -> float:
    """Narayanan et al. 2021, eq. 3 — a cross-check for dense models with f = 4h."""
    B, s, L, h, V = global_batch, model.seq_len, model.n_layers, model.d_model, model.vocab_size
    if full_recompute:
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
