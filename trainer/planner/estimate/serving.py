"""Served speed at a number of concurrent streams: time to first token, time between tokens and tokens/s of an
engine that batches every running stream into each decode step (docs/formulas.md, Serving).

One iteration of the engine with s streams running, each at a mean context of c tokens, costs
    device(s)    = Σ GEMMs (layers · gemm) + L · attention                  a forward of s tokens, one per stream
    iteration(s) = step_host + s · token_host + device(s) + s / n · prefill_device
where n is the tokens a request asks for (s / n requests join per iteration, each with its prompt's prefill). The
host terms are what serving costs besides the model's arithmetic: ``step_host`` per iteration (the engine's loop
and the launch of the step's operations) and ``token_host`` per token of each stream (sampling, detokenizing, the
response through the server and the client). A stream gets a token per iteration, so
    time per output token = iteration(s)
    time to first token   = request_host + queue + wait + iteration(s) + prefill
    tokens/s              = s · n / (request_host + queue + wait + n · time per output token)
where wait = iteration(s) / 2 when others run (the iteration a new request waits for) and queue = (s − 1)/2 ·
queue_host: streams that ask as many tokens end together and come back in a burst, whose requests the server
receives one at a time (the mean iteration already holds every request's prefill, so a stream's cycle is its
request, its waits and n iterations)
The host terms cannot be read off a datasheet: ``fit_host_costs`` solves them from two measurements of a probe
model of the same layers (its host work is the target's) at two stream counts. The device's kernels are either
each one's roofline at a device's rates (``Rates``: a preset's datasheet figures), or each one timed on the machine
that serves (``bench.deploy.predict.TimedKernels``), where small products run far from any roofline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trainer.contract import ModelSpec, SpecError
from trainer.planner.estimate.figure import Figure, fig, total
from trainer.planner.estimate.gemms import Gemm, serving_gemms

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class Kernels(Protocol):
    """What one kernel of a serving forward takes on the device, as a figure in seconds: a linear layer's product
    ``gemm`` (its weights read once), and the attention core of one layer, ``attention``, over ``sequences`` sequences
    of ``queries`` new tokens each, attending to ``context`` cached positions."""

    def gemm(self, g: Gemm, width: int) -> Figure: ...

    def attention(self, model: ModelSpec, sequences: int, queries: int, context: float, width: int) -> Figure: ...


@dataclass(frozen=True)
class Rates:
    """What the device sustains: FLOP/s on the model's matrix multiplies and bytes/s read from memory. As
    ``Kernels``, each kernel's roofline: the longer of its bytes over the bandwidth and its FLOPs over the rate."""
    flop_rate: float
    bandwidth: float

    def _roofline(self, bytes_read: Figure, flops: Figure, what: str) -> Figure:
        value = max(bytes_read.value / self.bandwidth, flops.value / self.flop_rate)
        return fig(value, "s", f"max(bytes_read / bandwidth, flops / flop_rate)  ({what})", bytes_read=bytes_read,
                   bandwidth=self.bandwidth, flops=flops, flop_rate=self.flop_rate)

    def gemm(self, g: Gemm, width: int) -> Figure:
        bytes_read = fig(width * g.count * (g.n * g.k + g.m * g.k + g.m * g.n), "bytes",
                         "width · count · (N·K + M·K + M·N)  (weights, input, output)", width=width, count=g.count,
                         M=g.m, N=g.n, K=g.k)
        flops = fig(g.flops, "FLOP", "2 · M · N · K · count · useful", M=g.m, N=g.n, K=g.k, count=g.count,
                    useful=g.useful)
        return self._roofline(bytes_read, flops, f"{g.name}: {g.m}×{g.n}×{g.k}")

    def attention(self, model: ModelSpec, sequences: int, queries: int, context: float, width: int) -> Figure:
        bytes_read = fig(sequences * context * 2 * model.kv_heads * model.head_dim * width, "bytes",
                         "sequences · context · 2 · kv_heads · head_dim · width  (the cached keys and values)",
                         sequences=sequences, context=context, kv_heads=model.kv_heads, head_dim=model.head_dim,
                         width=width)
        flops = fig(4 * sequences * queries * model.n_heads * model.head_dim * context, "FLOP",
                    "4 · sequences · queries · heads · head_dim · context  (scores and values)", sequences=sequences,
                    queries=queries, heads=model.n_heads, head_dim=model.head_dim, context=context)
        return self._roofline(bytes_read, flops, "attention")


@dataclass(frozen=True)
class HostCosts:
    """Seconds serving spends outside the model's arithmetic: per iteration, per streamed token, per request, and
    per request ahead in a burst (``queue_s``: the part of receiving a request that the server does one request at
    a time, as a Python front end does under its interpreter lock)."""
    step_s: float
    token_s: float
    request_s: float
    queue_s: float = 0.0


@dataclass(frozen=True)
class Load:
    """What the benchmark asks: concurrent streams, prompt tokens and new tokens per request."""
    streams: int
    prompt_tokens: int
    new_tokens: int


def _device(model: ModelSpec, kernels: Kernels, sequences: int, tokens_each: int, context: float, precision: str,
            what: str) -> Figure:
    """One forward over ``sequences`` sequences of ``tokens_each`` new tokens at a mean ``context``: each GEMM of
    ``serving_gemms`` as many times as layers run it, and each layer's attention core."""
    width = _BYTES[precision]
    parts = {}
    for g, layers in serving_gemms(model, sequences * tokens_each, sequences):
        kernel = kernels.gemm(g, width)
        parts[g.name.replace(".", "_")] = fig(layers * kernel.value, "s", "layers · kernel", layers=layers,
                                              kernel=kernel)
    gemms = total("s", parts)
    attention = kernels.attention(model, sequences, tokens_each, context, width)
    return fig(gemms.value + model.n_layers * attention.value, "s", f"gemms + layers · attention  ({what})",
               gemms=gemms, layers=model.n_layers, attention=attention)


def _check(model: ModelSpec, load: Load, precision: str) -> None:
    problems = {f"model.{k}": v for k, v in model.problems().items() if v}
    if problems:
        raise SpecError(problems)
    if precision not in _BYTES:
        raise SpecError.single("precision", f"precision={precision!r} must be one of {sorted(_BYTES)}")
    for name in ("streams", "prompt_tokens", "new_tokens"):
        if getattr(load, name) < 1:
            raise SpecError.single(name, f"{name}={getattr(load, name)!r} must be a positive integer")
    if load.prompt_tokens + load.new_tokens > model.seq_len:
        raise SpecError.single("new_tokens", f"{load.prompt_tokens} prompt + {load.new_tokens} new tokens exceed "
                                             f"the model's context of {model.seq_len}: ask fewer")


def iteration_device(model: ModelSpec, kernels: Kernels, load: Load, streams: int, precision: str = "fp32") -> Figure:
    """The device time of one iteration at ``streams`` streams: their decode step, and their share of prefills."""
    context = load.prompt_tokens + load.new_tokens / 2
    decode = _device(model, kernels, streams, 1, context, precision, "a decode step")
    prefill = _device(model, kernels, 1, load.prompt_tokens, load.prompt_tokens / 2, precision, "a prompt")
    return fig(decode.value + streams / load.new_tokens * prefill.value, "s",
               "decode + streams / new_tokens · prefill  (requests join as others end)", decode=decode,
               streams=streams, new_tokens=load.new_tokens, prefill=prefill)


def serving_estimate(model: ModelSpec, kernels: Kernels, host: HostCosts, load: Load,
                     precision: str = "fp32") -> dict[str, Figure]:
    """Time per output token, time to first token and tokens/s at ``load``, with the figures they come from."""
    _check(model, load, precision)
    s = load.streams
    device = iteration_device(model, kernels, load, s, precision)
    iteration = fig(host.step_s + s * host.token_s + device.value, "s",
                    "step_host + streams · token_host + device", step_host=host.step_s, streams=s,
                    token_host=host.token_s, device=device)
    prefill = device.terms["prefill"]  # the request's own prompt, as the iteration's share of prefills counts it
    wait = fig(iteration.value / 2 if s > 1 else 0.0, "s",
               "iteration / 2 · min(1, streams − 1)  (the running iteration a new request waits for)",
               iteration=iteration, streams=s)
    # streams asking the same number of tokens end in the same iteration and come back together, so each request
    # waits on average for half the others of its burst to be received
    queue = fig((s - 1) / 2 * host.queue_s, "s",
                "(streams − 1) / 2 · queue_host  (the requests of a burst received one at a time)", streams=s,
                queue_host=host.queue_s)
    ttft = fig(host.request_s + queue.value + wait.value + iteration.value + prefill.value, "s",
               "request_host + queue + wait + iteration + prefill  (the first token comes out of an iteration with "
               "the request's whole prompt in it)", request_host=host.request_s, queue=queue, wait=wait,
               iteration=iteration, prefill=prefill)
    # a stream's cycle: its request is received and waits for the running iteration, then one token comes out of
    # each of n iterations (whose mean already holds every request's prefill, s/n of them per iteration)
    cycle = host.request_s + queue.value + wait.value + load.new_tokens * iteration.value
    tokens_per_s = fig(s * load.new_tokens / cycle, "tokens/s",
                       "streams · new_tokens / (request_host + queue + wait + new_tokens · tpot)", streams=s,
                       new_tokens=load.new_tokens, request_host=host.request_s, queue=queue, wait=wait,
                       tpot=iteration)
    return {"time_per_output_token": iteration, "time_to_first_token": ttft, "tokens_per_s": tokens_per_s}


def fit_host_costs(probe: ModelSpec, kernels: Kernels, load: Load, measured: list[tuple[int, float, float]],
                   precision: str = "fp32", decoding: float = 0.0) -> HostCosts:
    """The host costs that make ``serving_estimate`` reproduce two measurements of ``probe``: ``measured`` holds
    (streams, time per output token s, time to first token s) at two stream counts, the first of them one stream.
    The time per output token is linear in the streams once the device's share is taken out, so two points give
    ``step_s`` and ``token_s``; one stream's time to first token gives ``request_s``, and what the other level's
    adds beyond its iterations gives ``queue_s``. ``decoding``: the streams the second level's tokens saw decoding
    at once where the client measured it (a server slow to take requests decodes fewer than it was sent), else
    its streams."""
    if len(measured) != 2 or measured[0][0] != 1 or measured[1][0] <= 1:
        raise ValueError(f"two measurements are needed, at 1 stream and at more: got streams "
                         f"{[m[0] for m in measured]}")
    (s1, tpot1, ttft1), (s2, tpot2, ttft2) = measured
    decoding = min(s2, decoding) if decoding >= s1 + 1 else s2  # below, the client's records tell nothing usable
    alone = iteration_device(probe, kernels, load, 1, precision)
    host1 = tpot1 - alone.value
    host2 = tpot2 - iteration_device(probe, kernels, load, round(decoding), precision).value
    token_s = max(0.0, (host2 - host1) / (decoding - s1))
    step_s = max(0.0, host1 - token_s)
    request_s = max(0.0, ttft1 - tpot1 - alone.terms["prefill"].value)
    unqueued = serving_estimate(probe, kernels, HostCosts(step_s, token_s, request_s),
                                Load(s2, load.prompt_tokens, load.new_tokens), precision)["time_to_first_token"]
    queue_s = max(0.0, (ttft2 - unqueued.value) / ((s2 - 1) / 2))
    return HostCosts(step_s=step_s, token_s=token_s, request_s=request_s, queue_s=queue_s)
