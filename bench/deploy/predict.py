"""The planner's serving prediction, set beside what the benchmark client measures (trainer.planner.estimate.serving).

The prediction has two kinds of terms. The device's: the model's kernels, each timed on this machine at its shape
(``TimedKernels``: the engine's own linear product and attention core, with the engine's compute threads), since
the products of a small model's decode step run far below what a large matrix multiply or a large copy sustain. The
host's: what the engine, Triton, the web app and the client spend per iteration, per token and per request, which no
datasheet gives. Those are measured on a probe: the model's layers at the smallest width (``probe_spec``: d_model
64, one head of 64, what vLLM's attention also takes), so its host work is the target's and its arithmetic next to
nothing, served by the same engine through the same path and driven by the same client at one stream and at the
most streams asked (``probe_streams``). The target model is then predicted at every number of streams, the probe's
two levels included, from the probe's host costs and the target's own kernels.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils.benchmark import Timer

from deploy.serving.model import Linear, attend, store_step
from deploy.serving.tensor_parallel import cpu_threads
from trainer.contract import ModelSpec
from trainer.planner.estimate.figure import Figure, fig
from trainer.planner.estimate.gemms import Gemm
from trainer.planner.estimate.serving import HostCosts, Kernels, Load, fit_host_costs, serving_estimate

# the fewest streams of the probe's second level: enough that the cost of each stream's tokens stands out of the
# run-to-run noise of a single stream's (at 4 streams it did not: 0.12 to 0.40 ms a token)
PROBE_LEAST_STREAMS = 16
PROBE_WIDTH = 64
# the least memory the timed kernels cycle their operands through, and the multiple of the last-level cache: twice
# the cache leaves nothing of a kernel's operands in it by their next turn (on a 32 MB cache, a decode step's
# kernels timed through 64 MB and through 256 MB came within 4 % of each other)
KERNEL_BUFFER_BYTES = 64 * 2**20
CACHE_MULTIPLE = 2


def probe_streams(levels: list[int]) -> tuple[int, int]:
    """The probe's two levels: one stream, and the most the benchmark asks (at least PROBE_LEAST_STREAMS), so that
    every level is predicted inside the range the host costs were fitted over, not beyond it."""
    return 1, max(PROBE_LEAST_STREAMS, *levels)


def probe_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` at the smallest width: the same layers, kinds of layer, vocabulary and context, one head of 64."""
    return spec.replace(name="probe", d_model=PROBE_WIDTH, n_heads=1, n_kv_heads=0, ffn_hidden=0,
                        moe_ffn_hidden=PROBE_WIDTH if spec.moe_ffn_hidden else 0,
                        shared_expert_ffn=PROBE_WIDTH if spec.shared_expert_ffn else 0)


def largest_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest CPU cache this machine reports (its last level), in bytes; 0 where none is reported."""
    sizes = []
    for entry in root.glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=0)


class TimedKernels:
    """``Kernels`` timed on this machine, each shape once and kept (and again at ``time_again``, each kernel then
    the median of its timings): a linear layer's product as the engine computes it (``serving.model.Linear``) and
    its attention core (``serving.model.attend``), on the engine's compute threads
    (``serving.tensor_parallel.cpu_threads``). A decode step reads each weight once, after all the others have gone
    through the caches, so every product here reads its weights, and every attention its keys and values, from a
    different part of a buffer larger than the caches, all of it in turn (``torch.utils.benchmark.Timer`` times the
    passes)."""

    def __init__(self, threads: int = 0, buffer_bytes: int = 0, rounds: int = 3):
        self.threads = threads or cpu_threads(1)
        self.buffer_bytes = buffer_bytes or max(KERNEL_BUFFER_BYTES, CACHE_MULTIPLE * largest_cache_bytes())
        self.rounds = rounds
        self._buffers: dict = {}
        self._timers: dict[tuple, tuple[Timer, int]] = {}
        self._seconds: dict[tuple, list[float]] = {}

    def gemm(self, g: Gemm, width: int) -> Figure:
        def product(dtype):
            x = torch.randn(g.m, g.k, dtype=dtype)
            return g.n * g.k, lambda w: Linear(w.view(g.n, g.k), None, None, dtype)(x)

        seconds = self._timed(("gemm", g.m, g.n, g.k), width, product)
        return fig(g.count * seconds, "s", "count · timed  (one product of M×K by K×N, its weights from memory)",
                   count=g.count, timed=seconds)

    def attention(self, model: ModelSpec, sequences: int, queries: int, context: float, width: int) -> Figure:
        """A decode step's: each sequence's new key and value stored in its slot of the engine's cache (a slot
        holds seq_len positions), then one query a sequence over ``context`` positions of it, masked as the engine
        masks them. For ``queries`` > 1, a whole prompt's: causal over itself, as the engine computes a fresh
        prompt."""
        heads, kv, d = model.n_heads, model.kv_heads, model.head_dim
        prompt = queries > 1
        positions = queries if prompt else max(1, round(context))
        slot = positions if prompt else model.seq_len

        def core(dtype):
            q = torch.randn(sequences, heads, queries, d, dtype=dtype)
            new = torch.randn(sequences, kv, d, dtype=dtype)
            rows, last = torch.arange(sequences), torch.full((sequences,), positions - 1)
            mask = None if prompt else torch.ones(sequences, 1, 1, positions, dtype=torch.bool)
            size = sequences * kv * slot * d

            def run(part):
                keys, values = part[:size].view(sequences, kv, slot, d), part[size:].view(sequences, kv, slot, d)
                if not prompt:
                    store_step(keys, values, rows, last, new, new)
                return attend(q, keys[:, :, :positions], values[:, :, :positions], mask, heads // kv, causal=prompt)
            return 2 * size, run

        seconds = self._timed(("attention", sequences, queries, positions, slot, heads, kv, d), width, core)
        return fig(seconds, "s", "timed  (scaled_dot_product_attention over the cached keys and values)",
                   timed=seconds)

    def _timed(self, key: tuple, width: int, make: Callable) -> float:
        """Seconds of one call of the kernel ``make(dtype)`` returns (its operand's elements, and the call on an
        operand), each call on the next part of the buffer: the median of its timings, each the mean of ``rounds``
        passes over the whole buffer after PyTorch's timer has warmed up with two and set the engine's threads."""
        key = key + (width,)
        if key not in self._timers:
            dtype = {4: torch.float32, 2: torch.bfloat16}[width]
            elements, run = make(dtype)
            buffer = self._buffer(dtype, 2 * elements)
            parts = [buffer[i * elements:(i + 1) * elements] for i in range(buffer.numel() // elements)]
            self._timers[key] = Timer("for part in parts: run(part)", globals={"parts": parts, "run": run},
                                      num_threads=self.threads), len(parts)
            self._seconds[key] = []
            self._time(key)
        return statistics.median(self._seconds[key])

    def _time(self, key: tuple) -> None:
        timer, calls = self._timers[key]
        self._seconds[key].append(timer.timeit(self.rounds).mean / calls)

    def time_again(self) -> None:
        """Every kernel timed so far, timed once more. On a shared machine a kernel's time varies by a sixth from
        one minute to the next (a decode step of the benchmark model at 32 streams: 7.7 to 11.4 ms), as the
        served engine's does, so a benchmark that runs its levels several times times its kernels beside each
        round and takes their medians."""
        for key in self._timers:
            self._time(key)

    def _buffer(self, dtype, at_least: int):
        size = max(self.buffer_bytes // dtype.itemsize, at_least)
        if self._buffers.get(dtype) is None or self._buffers[dtype].numel() < size:
            self._buffers[dtype] = torch.empty(size, dtype=dtype).uniform_(-0.05, 0.05)
        return self._buffers[dtype]


@dataclass(frozen=True)
class PathPrediction:
    """One path's fitted host costs, and the target's predicted tokens/s at any number of streams."""
    host: HostCosts
    target: ModelSpec
    kernels: Kernels
    prompt_tokens: int
    new_tokens: int

    def tokens_per_s(self, streams: int) -> float:
        load = Load(streams, self.prompt_tokens, self.new_tokens)
        return serving_estimate(self.target, self.kernels, self.host, load)["tokens_per_s"].value


def predict_path(target: ModelSpec, probe: ModelSpec, kernels: Kernels, prompt_tokens: int, new_tokens: int,
                 measured: list[tuple[int, float, float]], decoding: float = 0.0) -> PathPrediction:
    """The prediction for one path from the probe's ``measured`` (streams, time per output token s, time to first
    token s) at its two levels (``probe_streams``)."""
    host = fit_host_costs(probe, kernels, Load(1, prompt_tokens, new_tokens), measured, decoding=decoding)
    return PathPrediction(host, target, kernels, prompt_tokens, new_tokens)
