"""Served speed at a number of concurrent streams: time to first token, time between tokens and tokens/s of an
engine that batches every running stream into each decode step (docs/formulas.md, Serving).

One iteration of the engine with s streams running, each at a mean context of c tokens, costs
    device(s)    = max(bytes_read / bandwidth, flops / flop_rate)       weights once, every stream's KV cache
    iteration(s) = step_host + s · token_host + device(s) + s / n · prefill_device
where n is the tokens a request asks for (s / n requests join per iteration, each with its prompt's prefill). The
host terms are what serving costs besides the model's arithmetic: ``step_host`` per iteration (the engine's loop
and the launch of the step's operations) and ``token_host`` per token of each stream (sampling, detokenizing, the
response through the server and the client). A stream gets a token per iteration, so
    time per output token = iteration(s)
    time to first token   = request_host + wait + iteration(s) + prefill,  wait = iteration(s) / 2 when others run
    tokens/s              = s · n / (request_host + wait + n · time per output token)
(the mean iteration already holds every request's prefill, so a stream's cycle is its wait and n iterations)
The host terms cannot be read off a datasheet: ``fit_host_costs`` solves them from two measurements of a probe
model of the same layers (its host work is the target's) at two stream counts; the device terms come from the
machine's measured rates, or a preset's datasheet figures.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.contract import ModelSpec, SpecError
from trainer.planner.estimate.figure import Figure, fig
from trainer.planner.estimate.params import count

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Rates:
    """What the device sustains: FLOP/s on the model's matrix multiplies and bytes/s read from memory."""
    flop_rate: float
    bandwidth: float


@dataclass(frozen=True)
class HostCosts:
    """Seconds serving spends outside the model's arithmetic: per iteration, per streamed token, per request."""
    step_s: float
    token_s: float
    request_s: float


@dataclass(frozen=True)
class Load:
    """What the benchmark asks: concurrent streams, prompt tokens and new tokens per request."""
    streams: int
    prompt_tokens: int
    new_tokens: int


def _device(model: ModelSpec, rates: Rates, sequences: int, tokens_each: int, context: float, precision: str,
            what: str) -> Figure:
    """One forward over ``sequences`` sequences of ``tokens_each`` new tokens at a mean ``context``: the weights are
    read once, each sequence's KV cache of ``context`` tokens once; the multiplies are 2·N per token and attention
    4·L·d·context per token (scores and values)."""
    width = _BYTES[precision]
    weights = count(model).total * width
    kv_per_token = 2 * model.n_layers * model.kv_heads * model.head_dim * width
    tokens = sequences * tokens_each
    bytes_read = fig(weights + sequences * context * kv_per_token, "bytes",
                     "weight_bytes + sequences · context · kv_bytes_per_token", weight_bytes=weights,
                     sequences=sequences, context=context, kv_bytes_per_token=kv_per_token)
    n = count(model).matmul_per_token
    flops = fig(tokens * (2 * n + 4 * model.n_layers * model.d_model * context), "FLOP",
                "tokens · (2·N + 4·L·d·context)", tokens=tokens, N=n, L=model.n_layers, d=model.d_model,
                context=context)
    value = max(bytes_read.value / rates.bandwidth, flops.value / rates.flop_rate)
    return fig(value, "s", f"max(bytes_read / bandwidth, flops / flop_rate)  ({what})", bytes_read=bytes_read,
               bandwidth=rates.bandwidth, flops=flops, flop_rate=rates.flop_rate)


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


def iteration_device(model: ModelSpec, rates: Rates, load: Load, streams: int, precision: str = "fp32") -> Figure:
    """The device time of one iteration at ``streams`` streams: their decode step, and their share of prefills."""
    context = load.prompt_tokens + load.new_tokens / 2
    decode = _device(model, rates, streams, 1, context, precision, "a decode step")
    prefill = _device(model, rates, 1, load.prompt_tokens, load.prompt_tokens / 2, precision, "a prompt")
    return fig(decode.value + streams / load.new_tokens * prefill.value, "s",
               "decode + streams / new_tokens · prefill  (requests join as others end)", decode=decode,
               streams=streams, new_tokens=load.new_tokens, prefill=prefill)


def serving_estimate(model: ModelSpec, rates: Rates, host: HostCosts, load: Load,
                     precision: str = "fp32") -> dict[str, Figure]:
    """Time per output token, time to first token and tokens/s at ``load``, with the figures they come from."""
    _check(model, load, precision)
    s = load.streams
    device = iteration_device(model, rates, load, s, precision)
    iteration = fig(host.step_s + s * host.token_s + device.value, "s",
                    "step_host + streams · token_host + device", step_host=host.step_s, streams=s,
                    token_host=host.token_s, device=device)
    prefill = device.terms["prefill"]  # the request's own prompt, as the iteration's share of prefills counts it
    wait = fig(iteration.value / 2 if s > 1 else 0.0, "s",
               "iteration / 2 · min(1, streams − 1)  (the running iteration a new request waits for)",
               iteration=iteration, streams=s)
    ttft = fig(host.request_s + wait.value + iteration.value + prefill.value, "s",
               "request_host + wait + iteration + prefill  (the first token comes out of an iteration with the "
               "request's whole prompt in it)", request_host=host.request_s, wait=wait, iteration=iteration,
               prefill=prefill)
    # a stream's cycle: its request is received and waits for the running iteration, then one token comes out of
    # each of n iterations (whose mean already holds every request's prefill, s/n of them per iteration)
    cycle = host.request_s + wait.value + load.new_tokens * iteration.value
    tokens_per_s = fig(s * load.new_tokens / cycle, "tokens/s",
                       "streams · new_tokens / (request_host + wait + new_tokens · tpot)", streams=s,
                       new_tokens=load.new_tokens, request_host=host.request_s, wait=wait, tpot=iteration)
    return {"time_per_output_token": iteration, "time_to_first_token": ttft, "tokens_per_s": tokens_per_s}


def fit_host_costs(probe: ModelSpec, rates: Rates, load: Load, measured: list[tuple[int, float, float]],
                   precision: str = "fp32") -> HostCosts:
    """The host costs that make ``serving_estimate`` reproduce two measurements of ``probe``: ``measured`` holds
    (streams, time per output token s, time to first token s) at two stream counts, the first of them one stream.
    The time per output token is linear in the streams once the device's share is taken out, so two points give
    ``step_s`` and ``token_s``; one stream's time to first token gives ``request_s``."""
    if len(measured) != 2 or measured[0][0] != 1 or measured[1][0] <= 1:
        raise ValueError(f"two measurements are needed, at 1 stream and at more: got streams "
                         f"{[m[0] for m in measured]}")
    (s1, tpot1, ttft1), (s2, tpot2, _) = measured
    alone = iteration_device(probe, rates, load, 1, precision)
    host1 = tpot1 - alone.value
    host2 = tpot2 - iteration_device(probe, rates, load, s2, precision).value
    token_s = max(0.0, (host2 - host1) / (s2 - s1))
    step_s = max(0.0, host1 - token_s)
    request_s = max(0.0, ttft1 - tpot1 - alone.terms["prefill"].value)
    return HostCosts(step_s=step_s, token_s=token_s, request_s=request_s)
