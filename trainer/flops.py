"""Model FLOPs per step and MFU (PaLM, Chowdhery et al. 2022, appendix B).

Training costs 6 FLOPs per parameter per token in matrix multiplications (2 forward, 4 backward) plus the
attention scores and their use, 12·L·h·s per token (q kᵀ and the weighted sum of v, forward and backward; counted
for the full s × s square, as PaLM does). N counts the parameters that take part in a matmul: every block weight
and the LM head; not the position table, and not the token table when it is a separate lookup (untied head).
Model FLOPs exclude activation recompute, so MFU does not reward recomputation.
"""
from __future__ import annotations

from trainer.contract import ModelSpec


def matmul_params(spec: ModelSpec) -> int:
    """Weights one token multiplies by: in a mixture-of-experts layer the router (h·E) and its k experts only."""
    h, f, L = spec.d_model, spec.ffn, spec.n_layers
    kv = spec.kv_heads * spec.head_dim
    attn = h * h + 2 * h * kv + h * h
    mlp = 2 * h * f
    moe = len(spec.moe_layers)
    return L * attn + (L - moe) * mlp + moe * (spec.top_k * mlp + h * spec.n_experts) + spec.vocab_size * h


def flops_per_token(spec: ModelSpec) -> int:
    return 6 * matmul_params(spec) + 12 * spec.n_layers * spec.d_model * spec.seq_len


def flops_per_step(spec: ModelSpec, global_batch: int) -> int:
    return flops_per_token(spec) * global_batch * spec.seq_len


def mfu(flops: float, step_time_s: float, peak_tflops: float, n_devices: int) -> float:
    """Achieved model FLOP/s over the peak of all devices."""
    return flops / step_time_s / (peak_tflops * 1e12 * n_devices) if step_time_s > 0 else 0.0
