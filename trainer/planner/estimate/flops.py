"""FLOPs per token and per step, and MFU: the one FLOPs formula of the project (docs/formulas.md, FLOPs).

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B): 6·N + 12·L·h·s. Training costs 6 FLOPs per
parameter per token in matrix multiplications (2 forward, 4 backward); N counts the parameters a token multiplies by
(every block weight matrix, the router and k of E experts in a mixture-of-experts layer, and the V·h head, tied or
not; embedding lookups, biases and LayerNorms are O(h) and left out). 12·L·h·s are the attention score and value
products (q·kᵀ and the weighted sum of v: forward 4·s·h per layer, backward twice that), counted over the full s×s
square as PaLM does. Model FLOPs exclude recomputation, so MFU does not reward it; hardware FLOPs add it: full
recompute runs each block's forward again (2·N_blocks + 4·L·h·s), selective recompute the attention core only
(4·L·h·s).

The trainer reports MFU with these functions and the planner estimates with them, so that an estimate and a
measurement of the same run divide the same FLOPs.
"""
from __future__ import annotations

from trainer.planner.estimate.expr import Term, lift, symbols
from trainer.planner.estimate.params import count
from trainer.contract import ModelSpec

(N, N_blocks, L, h, s, B, V) = symbols("N N_blocks L h s B V")
(flops, step, gpus, peak_flops, per_token) = symbols("flops step gpus peak_flops per_token")
ATTENTION_FORWARD = 4 * L * h * s
MODEL_FLOPS_PER_TOKEN = Term(6 * N + 12 * L * h * s, "N L h s", "PaLM appendix B")
RECOMPUTE_FLOPS_PER_TOKEN = {
    "full": Term(2 * N_blocks + ATTENTION_FORWARD, "N_blocks L h s", "full recompute: the blocks' forward again"),
    "selective": Term(ATTENTION_FORWARD, "L h s", "selective recompute: the attention core's forward again"),
    "none": Term(lift(0), "", "no recompute"),
}
PER_STEP = Term(per_token * B * s, "per_token B s", "B sequences of s tokens")
UTILISATION = Term(flops / step / (peak_flops * gpus), "flops step peak_flops gpus",
                   "FLOPs a step over what the devices could do in it")
# Narayanan et al. 2021, eq. 3, with and without full recompute
_NARAYANAN = "Narayanan et al. 2021 eq. 3, for dense models with f = 4h and kv = h: equals %s"
NARAYANAN = {True: Term(96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), "B s L h V",
                        _NARAYANAN % "hardware_per_step with full recompute"),
             False: Term(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L)), "B s L h V",
                         _NARAYANAN % "model_per_step without recompute")}


def matmul_params(model: ModelSpec) -> int:
    """N: the parameters one token multiplies by (``ParamCounts.matmul_per_token``)."""
    return count(model).matmul_per_token


def model_flops_per_token(model: ModelSpec) -> int:
    """6·N + 12·L·h·s."""
    return MODEL_FLOPS_PER_TOKEN(matmul_params(model), model.n_layers, model.d_model, model.seq_len)


def model_flops_per_step(model: ModelSpec, global_batch: int) -> int:
    """Model FLOPs of one step of ``global_batch`` sequences of seq_len tokens."""
    return PER_STEP(model_flops_per_token(model), global_batch, model.seq_len)


def recompute_flops_per_token(model: ModelSpec, checkpointing: str) -> int:
    """FLOPs per token that activation checkpointing adds: what hardware FLOPs count beyond model FLOPs."""
    term = RECOMPUTE_FLOPS_PER_TOKEN[checkpointing]
    return term(*recompute_args(model, checkpointing))


def recompute_args(model: ModelSpec, checkpointing: str) -> tuple[int, ...]:
    """The numbers ``RECOMPUTE_FLOPS_PER_TOKEN[checkpointing]`` takes."""
    shape = (model.n_layers, model.d_model, model.seq_len)
    if checkpointing == "full":
        return (matmul_params(model) - model.vocab_size * model.d_model, *shape)
    return shape if checkpointing == "selective" else ()


def mfu(flops: float, step_time_s: float, peak_tflops: float, n_devices: int) -> float:
    """Achieved FLOP/s (``flops`` per step over the step time) over the peak of all devices; 0 for a non-positive
    step time. Model FLOPs give MFU, hardware FLOPs the hardware FLOPs utilisation."""
    if step_time_s <= 0:
        return 0.0
    return UTILISATION(flops, step_time_s, peak_tflops * 1e12, n_devices)


def narayanan_flops_per_step(model: ModelSpec, global_batch: int, full_recompute: bool) -> float:
    """Narayanan et al. 2021, eq. 3 — a cross-check for dense models with f = 4h."""
    return NARAYANAN[full_recompute](global_batch, model.seq_len, model.n_layers, model.d_model, model.vocab_size)
