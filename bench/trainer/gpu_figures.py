"""The arithmetic of ``python -m bench.trainer.gpu_check``: measured numbers and the planner's estimates in, rows
with ratios, pass/fail and — for a missed target — what limits it, out. No torch, no timing: everything here is a
function of its arguments, so the tests check it exactly.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from trainer.contract import ClusterSpec, ModelSpec
from trainer.contract.records import last_step_rows
from trainer.planner.estimate import PlanNumbers, inference_estimate

# The targets: MFU of a dense bf16 model on one GPU (Megatron-class trainers reach 45–55 % on A100/H100); the
# planner's peak memory within 5 % of the allocator's; decoding at 60 % of the HBM bound.
MFU_TARGET = 0.45
MEMORY_ERROR_TARGET = 0.05
DECODE_FRACTION_TARGET = 0.60

# Bytes per parameter the fp32 AdamW step and the gradient clip move in HBM: weight read + write (8), gradient
# read for the norm and for the update (8), both moments read + write (16).
OPTIMIZER_BYTES_PER_PARAM = 32
# Autocast casts every fp32 weight to bf16 once per micro-batch: read 4 bytes, write 2.
CAST_BYTES_PER_PARAM = 6


@dataclass(frozen=True)
class Row:
    """One target: the figure reached (``figure``), what it was computed from, and the verdict."""

    name: str
    measured: float
    reference: float      # what the measurement is held against: peak FLOP/s, the planner's bytes, the HBM bound
    unit: str
    figure: float         # the ratio or error the target applies to
    target: float
    higher_is_better: bool
    passed: bool
    limit: str = ""       # one line on what holds the figure back; empty when the target is met

    def to_dict(self) -> dict:
        return asdict(self)


def relative_error(measured: float, estimate: float) -> float:
    """|estimate − measured| / measured: the planner's error as docs/planner.md states its calibration errors."""
    return abs(estimate - measured) / measured


def verdict(figure: float, target: float, higher_is_better: bool) -> bool:
    """A target met exactly counts as met."""
    return figure >= target if higher_is_better else figure <= target


# ---- training ----------------------------------------------------------------------------------------------

def training_measurement(records: list[dict], warmup: int) -> dict:
    """Medians of the steps after ``warmup`` (the first pays for the memory probe and the allocator's growth; at
    least the last step is kept) from metrics.jsonl's records; model-state and activation bytes from the first
    step, which measures them; the allocator's peak over all steps (None where the device reports none)."""
    rows = last_step_rows(records)
    kept = rows[min(warmup, len(rows) - 1):]
    first = rows[0]["memory"]
    peaks = [r["memory"].get("max_allocated_bytes") for r in rows]
    return {"steps": len(rows), "timed_steps": len(kept),
            "step_time_s": statistics.median(r["step_time_s"] for r in kept),
            "mfu": statistics.median(r["mfu"] for r in kept),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in kept),
            "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"],
            "states_bytes": first["params_bytes"] + first["grads_bytes"] + first["optimizer_bytes"],
            "activations_bytes": first["activations_bytes"],
            "max_allocated_bytes": None if None in peaks else max(peaks)}


def planned_parts(numbers: PlanNumbers) -> dict[str, float]:
    """The planner's peak stage split as the trainer measures it: model states, saved activations, and the rest
    (the buffers live at the peak). The allocator's peak counts what it hands out, so the overheads (the CUDA
    context, the driver's reserve, NCCL, fragmentation) stay out of the comparison."""
    stage = next(s for s in numbers.stages if s.stage == numbers.peak_stage)
    return {"states": stage.model_state_bytes, "activations": stage.activations,
            "rest": sum(stage.buffers.values())}


def measured_parts(measured: dict) -> dict[str, float]:
    """The same split of what was measured. Without an allocator peak (the CPU) the rest is unknown: the
    comparison is then of states and activations alone, on both sides (``compared_parts``)."""
    parts = {"states": float(measured["states_bytes"]), "activations": float(measured["activations_bytes"])}
    if measured["max_allocated_bytes"] is not None:
        parts["rest"] = measured["max_allocated_bytes"] - parts["states"] - parts["activations"]
    return parts


def compared_parts(measured: dict, numbers: PlanNumbers) -> tuple[dict[str, float], dict[str, float]]:
    """(measured, planned) parts over the same keys: all three with an allocator peak, else states and
    activations."""
    got, planned = measured_parts(measured), planned_parts(numbers)
    return got, {k: planned[k] for k in got}


def mfu_row(measured_mfu: float, limit: str = "") -> Row:
    passed = verdict(measured_mfu, MFU_TARGET, True)
    return Row("training MFU", measured_mfu, 1.0, "fraction of dense peak", measured_mfu, MFU_TARGET, True, passed,
               "" if passed else limit)


def memory_row(measured_bytes: float, estimated_bytes: float, limit: str = "") -> Row:
    error = relative_error(measured_bytes, estimated_bytes)
    passed = verdict(error, MEMORY_ERROR_TARGET, False)
    return Row("peak memory, planner error", measured_bytes, estimated_bytes, "bytes", error, MEMORY_ERROR_TARGET,
               False, passed, "" if passed else limit)


def memory_floor_share(params: int, step_time_s: float, grad_accum: int, bandwidth_bytes_per_s: float) -> float:
    """The share of a step that the optimizer update and autocast's weight casts need at full HBM speed: work that
    MFU does not count and that no matmul hides."""
    moved = params * (OPTIMIZER_BYTES_PER_PARAM + grad_accum * CAST_BYTES_PER_PARAM)
    return moved / bandwidth_bytes_per_s / step_time_s


def mfu_limit(floor_share: float, checkpointing: str, predicted_mfu: float) -> str:
    """What most likely holds MFU back, from the figures the check has (a profile of one step would split it)."""
    if checkpointing == "full":
        return "full recompute: a third more FLOPs than MFU counts"
    if floor_share > 0.10:
        return f"optimizer step and weight casts: memory-bound, {floor_share:.0%} of the step at full HBM speed"
    if predicted_mfu < MFU_TARGET:
        return (f"small matmuls: the planner's shape model expects {predicted_mfu:.0%} for this micro-batch; "
                "a larger one fills the GPU better")
    return ("kernels below dense peak: LayerNorm, GELU, residual adds and casts run as separate memory-bound "
            "kernels between the matmuls (nothing is compiled or fused)")


def memory_limit(measured: dict[str, float], planned: dict[str, float]) -> str:
    """The part (states, activations, the rest) where the planner's bytes differ most from the measured ones."""
    name = max(measured, key=lambda k: abs(measured[k] - planned[k]))
    return (f"{name}: measured {measured[name] / 1e9:.2f} GB, planned {planned[name] / 1e9:.2f} GB "
            f"({(planned[name] - measured[name]) / 1e9:+.2f} GB)")


# ---- decoding ----------------------------------------------------------------------------------------------

def decode_step_bounds(model: ModelSpec, cluster: ClusterSpec, batch: int, context: int,
                       precision: str = "bf16") -> tuple[float, float]:
    """(HBM-bound seconds of one decode step, the same when the KV cache is also copied once per step).

    The planner's bound reads the weights once and every sequence's cache once. The model's ``KVCache`` appends by
    ``torch.cat``, which reads the old cache and writes the new one before attention reads it: three passes."""
    est = inference_estimate(model, cluster, batch=batch, context=context, precision=precision)
    bandwidth = cluster.gpu.memory_bandwidth_gbs * 1e9
    weights, kv = est["weights_per_gpu"].value, est["kv_cache_per_gpu"].value
    return est["decode_time_per_token"].value, (weights + 3 * kv) / bandwidth


def decode_bound(model: ModelSpec, cluster: ClusterSpec, batch: int, prompt_len: int, new_tokens: int,
                 precision: str = "bf16", copying: bool = False) -> float:
    """Tokens/s the HBM bound allows for decoding ``new_tokens`` after a ``prompt_len`` prompt, ``batch`` sequences.

    Decode step i (0-based) feeds one token per sequence to a cache of prompt_len + i positions, so attention reads
    prompt_len + i + 1. A step's bound is affine in the context, so the mean over the steps is the mean of the
    first and the last: exact, with integer contexts only."""
    pick = 1 if copying else 0
    first = decode_step_bounds(model, cluster, batch, prompt_len + 1, precision)[pick]
    last = decode_step_bounds(model, cluster, batch, prompt_len + new_tokens, precision)[pick]
    return batch / ((first + last) / 2)


def decode_rows(measured: list[dict], bounds: dict[int, float], copy_bounds: dict[int, float],
                n_layers: int) -> list[Row]:
    """One row per batch size: measured tokens/s over the bound. ``measured`` holds {batch, tokens_per_s,
    step_s}; the smallest batch is the yardstick for how a step's time grows with the batch."""
    base = min(measured, key=lambda m: m["batch"])
    rows = []
    for m in sorted(measured, key=lambda m: m["batch"]):
        b = m["batch"]
        fraction = m["tokens_per_s"] / bounds[b]
        passed = verdict(fraction, DECODE_FRACTION_TARGET, True)
        limit = "" if passed else decode_limit(m, base, bounds[b], copy_bounds[b], n_layers)
        rows.append(Row(f"decode tokens/s, batch {b}", m["tokens_per_s"], bounds[b], "tokens/s", fraction,
                        DECODE_FRACTION_TARGET, True, passed, limit))
    return rows


def decode_limit(m: dict, base: dict, bound: float, copy_bound: float, n_layers: int) -> str:
    bound_step_s = m["batch"] / bound
    growth = m["step_s"] / base["step_s"]
    if m["batch"] == base["batch"] or growth < 1.25:
        return (f"host dispatch and kernel launches: {m['step_s'] * 1e3:.2f} ms a step against "
                f"{bound_step_s * 1e3:.2f} ms of HBM reads, ×{growth:.2f} from batch {base['batch']} "
                f"({n_layers} layers of eager kernels a token)")
    if m["tokens_per_s"] >= 0.7 * copy_bound:
        return (f"the KV cache grows by torch.cat: each step copies every layer's cache "
                f"(bound with the copy {copy_bound:,.0f} tokens/s)")
    return "attention over the cache and per-step host work: unfused kernels below HBM speed"


# ---- the summary ---------------------------------------------------------------------------------------------

def summary_lines(rows: list[Row]) -> list[str]:
    lines = []
    for r in rows:
        sign = "≥" if r.higher_is_better else "≤"
        line = (f"{r.name:<32} {r.figure:8.4g}  target {sign} {r.target:.2f}  "
                f"{'PASS' if r.passed else 'FAIL'}")
        lines.append(line + (f"  — {r.limit}" if r.limit else ""))
    return lines
