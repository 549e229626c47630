"""Serving memory and a decode-speed bound (docs/formulas.md, Inference).

    KV cache bytes per token = 2 · L · n_kv_heads · head_dim · bytes        (keys and values of every layer)
    per GPU with tensor parallel t: weights / t, KV heads / t
    decode time per token ≥ (weight bytes / t + KV bytes read) / memory bandwidth
Every decode step reads all weights once (shared by the batch) and each sequence's whole KV cache; the bound ignores
compute, which at small batch is far below the memory time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.planner.estimate.figure import Figure, fig
from trainer.planner.estimate.params import count
from trainer.contract import ClusterSpec, ModelSpec, SpecError

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}


@dataclass
class InferenceEstimate:
    figures: dict[str, Figure]

    def __getitem__(self, name: str) -> Figure:
        return self.figures[name]

    def to_dict(self) -> dict[str, Any]:
        return {k: v.to_dict() for k, v in self.figures.items()}


def inference_estimate(model: ModelSpec, cluster: ClusterSpec, tp: int = 1, batch: int = 1, context: int | None = None,
                       precision: str = "bf16", kv_precision: str | None = None) -> InferenceEstimate:
    """Weights, KV cache and the memory-bound decode time per token for ``batch`` sequences of ``context`` tokens."""
    problems = {k: v for k, v in model.problems().items() if v}
    if problems:
        raise SpecError({f"model.{k}": v for k, v in problems.items()})
    context = model.seq_len if context is None else context
    kv_precision = kv_precision or ("bf16" if precision == "int8" else precision)
    for name, value in (("tp", tp), ("batch", batch), ("context", context)):
        if not isinstance(value, int) or value < 1:
            raise SpecError.single(name, f"{name}={value!r} must be a positive integer")
    for name, value in (("precision", precision), ("kv_precision", kv_precision)):
        if value not in _BYTES:
            raise SpecError.single(name, f"{name}={value!r} must be one of {sorted(_BYTES)}")
    if model.kv_heads % tp and tp % model.kv_heads:
        raise SpecError.single("tp", f"tp={tp} does not split n_kv_heads={model.kv_heads}")
    w_bytes, kv_bytes = _BYTES[precision], _BYTES[kv_precision]
    n = count(model).total
    weights = fig(n * w_bytes, "bytes", "parameters · bytes", parameters=n, bytes=w_bytes)
    weights_gpu = fig(weights.value / tp, "bytes", "weights / t", weights=weights, t=tp)
    per_token = fig(2 * model.n_layers * model.kv_heads * model.head_dim * kv_bytes, "bytes/token",
                    "2 · L · n_kv_heads · head_dim · bytes", L=model.n_layers, n_kv_heads=model.kv_heads,
                    head_dim=model.head_dim, bytes=kv_bytes)
    kv = fig(per_token.value * batch * context, "bytes", "kv_per_token · batch · context", kv_per_token=per_token,
             batch=batch, context=context)
    kv_gpu = fig(kv.value / min(tp, model.kv_heads), "bytes", "kv_cache / min(t, n_kv_heads)  (heads replicate "
                 "beyond n_kv_heads)", kv_cache=kv, t=tp, n_kv_heads=model.kv_heads)
    total = fig(weights_gpu.value + kv_gpu.value, "bytes", "weights_per_gpu + kv_cache_per_gpu",
                weights_per_gpu=weights_gpu, kv_cache_per_gpu=kv_gpu)
    bandwidth = cluster.gpu.memory_bandwidth_gbs * 1e9
    decode = fig(total.value / bandwidth, "s/token", "bytes_read / memory_bandwidth_bytes_per_s  (every step reads "
                 "the weights on a GPU, weights / t, and the KV cache)", bytes_read=total,
                 memory_bandwidth_bytes_per_s=bandwidth)
    tokens_per_s = fig(batch / decode.value, "tokens/s", "batch / decode_time  (upper bound)", batch=batch,
                       decode_time=decode.value)
    flops = 2 * count(model).matmul_per_token
    peak = cluster.gpu.peak_tflops * 1e12
    prefill = fig(flops * batch * context / tp / peak, "s", "2·N·batch·context / t / peak_flops  (lower bound)",
                  N=count(model).matmul_per_token, batch=batch, context=context, t=tp, peak_flops=peak)
    return InferenceEstimate({
        "weights": weights, "weights_per_gpu": weights_gpu, "kv_per_token": per_token, "kv_cache": kv,
        "kv_cache_per_gpu": kv_gpu, "memory_per_gpu": total,
        "fits": fig(float(total.value <= cluster.gpu.memory_gb * 1e9), "bool", "memory_per_gpu ≤ capacity  (1 "
                    "when it fits; capacity = gpu.memory_gb · 1e9)", memory_per_gpu=total.value,
                    capacity=cluster.gpu.memory_gb * 1e9),
        "decode_time_per_token": decode, "decode_tokens_per_s": tokens_per_s, "prefill_time": prefill,
    })
