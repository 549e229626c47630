"""The planner's serving prediction, set beside what the benchmark client measures (trainer.planner.estimate.serving).

The prediction has two kinds of terms. The device's: the model's bytes and FLOPs over what this machine sustains,
measured here in a second (``machine_rates``: a large matrix multiply and a large copy), not the CPU preset's round
figures. The host's: what the engine, Triton, the web app and the client spend per iteration, per token and per
request, which no datasheet gives. Those are measured on a probe: the model's layers at the smallest width
(``probe_spec``: d_model 64, one head of 64, what vLLM's attention also takes), so its host work is the target's and
its arithmetic next to nothing, served by the same engine through the same path and driven by the same client at
``PROBE_STREAMS``. The target model is then predicted at every number of streams, the probe's two levels included,
from the probe's host costs and the target's own device terms.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from trainer.contract import ModelSpec
from trainer.planner.estimate.serving import HostCosts, Load, Rates, fit_host_costs, serving_estimate

# the two stream counts the probe is measured at: one stream, and a few, so the rest is extrapolated
PROBE_STREAMS = (1, 4)
PROBE_WIDTH = 64


def probe_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` at the smallest width: the same layers, kinds of layer, vocabulary and context, one head of 64."""
    return spec.replace(name="probe", d_model=PROBE_WIDTH, n_heads=1, n_kv_heads=0, ffn_hidden=0,
                        moe_ffn_hidden=PROBE_WIDTH if spec.moe_ffn_hidden else 0,
                        shared_expert_ffn=PROBE_WIDTH if spec.shared_expert_ffn else 0)


def machine_rates(size: int = 1024, copy_mb: int = 256, repeats: int = 5) -> Rates:
    """What this machine sustains in fp32, best of ``repeats``: FLOP/s of a ``size``³ matrix multiply, and bytes/s of
    a ``copy_mb`` MB copy (read and written, so twice its size moves)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    source = torch.empty(copy_mb * 2**20 // 4)
    target = torch.empty_like(source)
    torch.mm(a, b)
    target.copy_(source)
    best_mm = best_copy = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        torch.mm(a, b)
        best_mm = min(best_mm, time.perf_counter() - began)
        began = time.perf_counter()
        target.copy_(source)
        best_copy = min(best_copy, time.perf_counter() - began)
    return Rates(flop_rate=2 * size**3 / best_mm, bandwidth=2 * source.numel() * 4 / best_copy)


@dataclass(frozen=True)
class PathPrediction:
    """One path's fitted host costs, and the target's predicted tokens/s at any number of streams."""
    host: HostCosts
    target: ModelSpec
    rates: Rates
    prompt_tokens: int
    new_tokens: int

    def tokens_per_s(self, streams: int) -> float:
        load = Load(streams, self.prompt_tokens, self.new_tokens)
        return serving_estimate(self.target, self.rates, self.host, load)["tokens_per_s"].value


def predict_path(target: ModelSpec, probe: ModelSpec, rates: Rates, prompt_tokens: int, new_tokens: int,
                 measured: list[tuple[int, float, float]]) -> PathPrediction:
    """The prediction for one path from the probe's ``measured`` (streams, time per output token s, time to first
    token s) at PROBE_STREAMS."""
    host = fit_host_costs(probe, rates, Load(1, prompt_tokens, new_tokens), measured)
    return PathPrediction(host, target, rates, prompt_tokens, new_tokens)
