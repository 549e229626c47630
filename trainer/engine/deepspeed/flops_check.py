"""DeepSpeed's flops profiler as a cross-check of the planner's formula (trainer/planner/estimate/flops.py, PaLM's), reported, never used for MFU.

The profiler counts what it sees in one forward: 2·MACs of every F.linear (blocks and LM head: the formula's
2·N per token), the attention product of F.scaled_dot_product_attention, and elementwise work the formula leaves
out (LayerNorm, GELU, residual adds, softmax, routing). Training is taken as 3 × forward (backward ≈ 2 ×), as
the formula's 6N does. Known ways it goes wrong, hence the comparison rather than trust:
- inside a ZeRO-3 engine (or its ``flops_profiler`` config section) every Linear's MACs are counted twice, because
  ZeRO-3 replaces F.linear with its own gathered-weight function that the profiler wraps again. Measured on the
  tiny model, 64 tokens: 1.014e8 on the plain module (formula 1.007e8), 1.895e8 inside a ZeRO-3 engine — the
  extra 8.81e7 is exactly 6 · 229,376 matmul weights · 64 tokens once more; ZeRO-1 gives 1.014e8. So this check
  profiles the plain module before ``deepspeed.initialize``;
- a causal attention kernel does half the s² work the formula (and the profiler) count for the full square;
- mixture-of-experts layers run every expert on its capacity slots, padding included: the profiler sees
  E·cap rows per layer, the formula k·N.
"""
from __future__ import annotations

import torch
from torch import nn

from deepspeed.profiling.flops_profiler import get_model_profile

from trainer.contract import ModelSpec
from trainer.planner.estimate.flops import model_flops_per_token


def profile_forward_flops(model: nn.Module, spec: ModelSpec, batch: int = 1) -> dict[str, float]:
    """Profiler's and formula's FLOPs of one training step on ``batch`` sequences, and their ratio."""
    x = torch.zeros(batch, spec.seq_len, dtype=torch.long, device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            forward, _, _ = get_model_profile(model, args=[x], print_profile=False, as_string=False)
    finally:
        model.train(was_training)
    tokens = batch * spec.seq_len
    profiler = 3.0 * float(forward)
    formula = float(model_flops_per_token(spec) * tokens)
    return {"profiler_flops": profiler, "formula_flops": formula, "ratio": profiler / formula, "tokens": tokens}
