"""The serving engine: iteration-level (continuous) batching over a slot cache.

One loop serves every request. Each iteration
1. admits waiting requests into free slots: each prompt is run once (prefill), which gives its first token;
2. runs one decode step over every active sequence together, one new token each, whatever their lengths;
3. hands each sequence's token to its request: streamed at once, or kept for the one final answer; a sequence that
   reached max_tokens, the end-of-text token or a stop string, or whose request was cancelled, leaves its slot.
So a new request joins between two steps instead of waiting for the batch to drain, and a cancelled one stops within
one step. A sequence that fills the context window is started again over its last seq_len − 1 tokens, as the
trainer's generation does, so both produce the same tokens.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

import torch

from .sampling import Sampling, generator_for, pick


class Runner(Protocol):
    """The model as the engine drives it (``ServingGPT``, or rank 0 of a tensor-parallel group)."""

    slots: int

    def prefill(self, slot: int, ids: list[int]) -> torch.Tensor: ...

    def decode(self, slots: list[int], tokens: list[int]) -> torch.Tensor: ...

    def length(self, slot: int) -> int: ...


class Codec(Protocol):
    eos_id: Optional[int]

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of text or a stop string), "length" (max_tokens), "cancelled"
    unsent: str = ""    # streamed requests: the end of the text not streamed yet (it went to the final answer)


class Sink(Protocol):
    """Where a request's answer goes (a Triton response sender, a queue in tests)."""

    def on_token(self, text: str, token_id: int) -> None: ...

    def on_finish(self, result: Result) -> None: ...

    def on_error(self, message: str) -> None: ...

    def is_cancelled(self) -> bool: ...


@dataclass
class Request:
    prompt_ids: list[int]
    sink: Sink
    max_tokens: int = 64
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    stream: bool = False
    arrived: float = field(default_factory=time.perf_counter)

    def problems(self, seq_len: int) -> list[str]:
        found = []
        if not self.prompt_ids:
            found.append("the prompt is empty: give at least one token of text")
        if self.max_tokens < 1:
            found.append(f"max_tokens={self.max_tokens}: ask for at least 1")
        if self.sampling.temperature < 0 or not 0 < self.sampling.top_p <= 1 or self.sampling.top_k < 0:
            found.append(f"temperature={self.sampling.temperature} must be ≥ 0, top_p={self.sampling.top_p} in "
                         f"(0, 1], top_k={self.sampling.top_k} ≥ 0")
        return found


class Metrics(Protocol):
    def first_token(self, seconds: float) -> None: ...

    def decode_step(self, batch_size: int, seconds: float) -> None: ...

    def finished(self, completion_tokens: int, decode_seconds: float, reason: str) -> None: ...

    def active(self, sequences: int) -> None: ...


class CountingMetrics:
    """What the engine did, kept in memory (tests, benchmarks); the Triton model reports the same to Triton."""

    def __init__(self):
        self.first_tokens: list[float] = []
        self.batch_sizes: list[int] = []
        self.tokens = 0
        self.reasons: list[str] = []
        self.active_now = 0

    def first_token(self, seconds: float) -> None:
        self.first_tokens.append(seconds)

    def decode_step(self, batch_size: int, seconds: float) -> None:
        self.batch_sizes.append(batch_size)

    def finished(self, completion_tokens: int, decode_seconds: float, reason: str) -> None:
        self.tokens += completion_tokens
        self.reasons.append(reason)

    def active(self, sequences: int) -> None:
        self.active_now = sequences


@dataclass
class _Sequence:
    request: Request
    slot: int
    context: list[int]  # what the model has seen or is about to see: the prompt, then every generated token
    generator: Optional[torch.Generator]
    generated: list[int] = field(default_factory=list)
    sent: int = 0  # characters of the text already streamed
    first_at: float = 0.0
    done: bool = False


class Engine:
    def __init__(self, runner: Runner, codec: Codec, seq_len: int, metrics: Optional[Metrics] = None,
                 device: torch.device | str = "cpu"):
        self.runner, self.codec, self.seq_len = runner, codec, seq_len
        self.metrics = metrics or CountingMetrics()
        self.device = torch.device(device)
        self._waiting: deque[Request] = deque()
        self._active: list[_Sequence] = []
        self._free = list(range(runner.slots))
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    # -- requests in ---------------------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        problems = request.problems(self.seq_len)
        if problems:
            request.sink.on_error("; ".join(problems))
            return
        with self._wake:
            self._waiting.append(request)
            self._wake.notify()

    # -- the loop ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="serving-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and not self._active:
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self.step()
            except Exception as exc:  # a failed step fails the sequences in it, never the server
                self._fail_all(f"generation failed: {type(exc).__name__}: {exc}")
        self._fail_all("the model is being unloaded")

    def busy(self) -> bool:
        with self._wake:
            return bool(self._waiting or self._active)

    def step(self) -> None:
        """Admit what fits, then one decode step over every active sequence."""
        self._admit()
        batch: list[_Sequence] = []
        for seq in self._active:
            if seq.request.sink.is_cancelled():
                self._finish(seq, "cancelled")
            elif self.runner.length(seq.slot) >= self.seq_len:  # the window is full: start over on its tail
                self._emit(seq, self.runner.prefill(seq.slot, seq.context[-(self.seq_len - 1):]))
            else:
                batch.append(seq)
        if batch:
            batch.sort(key=lambda s: s.slot)  # consecutive slots are read in place (ServingGPT.decode)
            started = time.perf_counter()
            logits = self.runner.decode([s.slot for s in batch], [s.context[-1] for s in batch])
            self.metrics.decode_step(len(batch), time.perf_counter() - started)
            for seq, row in zip(batch, logits):
                self._emit(seq, row)
        self._active = [s for s in self._active if not s.done]
        self.metrics.active(len(self._active))

    def _admit(self) -> None:
        while True:
            with self._wake:
                if not self._waiting or not self._free:
                    return
                request = self._waiting.popleft()
            if request.sink.is_cancelled():
                request.sink.on_finish(Result("", [], len(request.prompt_ids), 0, "cancelled"))
                continue
            slot = min(self._free)  # the lowest free slot keeps the active ones consecutive (read in place)
            self._free.remove(slot)
            seq = _Sequence(request, slot, list(request.prompt_ids)[-self.seq_len:],
                            generator_for(request.sampling, self.device))
            self._active.append(seq)
            self._emit(seq, self.runner.prefill(seq.slot, seq.context))

    # -- tokens out ----------------------------------------------------------------------------------------------
    def _emit(self, seq: _Sequence, logits: torch.Tensor) -> None:
        request = seq.request
        token = pick(logits, request.sampling, seq.generator)
        if not seq.generated:
            seq.first_at = time.perf_counter()
            self.metrics.first_token(seq.first_at - request.arrived)
        seq.generated.append(token)
        seq.context.append(token)
        if token == self.codec.eos_id:
            self._finish(seq, "stop")
            return
        text = self.codec.decode(seq.generated)
        cut = _first_stop(text, request.stop, seq.sent)
        if cut is not None:
            self._send(seq, text[:cut], token)
            self._finish(seq, "stop", text[:cut])
        elif len(seq.generated) >= request.max_tokens:
            self._send(seq, text, token)
            self._finish(seq, "length", text)
        else:
            self._send(seq, text[:_safe_end(text, request.stop)], token)

    def _send(self, seq: _Sequence, upto: str, token: int) -> None:
        """Stream the text not yet sent, up to ``upto`` (held back: a partial character, a possible stop string)."""
        if seq.request.stream:
            delta = upto[seq.sent:] if len(upto) > seq.sent else ""
            seq.sent = max(seq.sent, len(upto))
            seq.request.sink.on_token(delta, token)

    def _finish(self, seq: _Sequence, reason: str, text: Optional[str] = None) -> None:
        if seq.done:
            return
        seq.done = True
        self._free.append(seq.slot)
        ids = [t for t in seq.generated if t != self.codec.eos_id]
        if text is None:
            text = self.codec.decode(ids)
            if reason == "cancelled" and seq.request.stop:
                text = text[:_safe_end(text, seq.request.stop)]
        if seq.generated:
            self.metrics.finished(len(seq.generated), time.perf_counter() - seq.first_at, reason)
        unsent = text[seq.sent:] if seq.request.stream else ""
        seq.request.sink.on_finish(Result(text, seq.generated, len(seq.request.prompt_ids), len(seq.generated),
                                          reason, unsent))

    def _fail_all(self, message: str) -> None:
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
        for seq in self._active:
            if not seq.done:
                seq.done = True
                self._free.append(seq.slot)
                seq.request.sink.on_error(message)
        self._active = []
        for request in waiting:
            request.sink.on_error(message)


def _first_stop(text: str, stops: tuple[str, ...], sent: int) -> Optional[int]:
    """Where the earliest stop string starts in ``text`` (only text after what was streamed can hold a new one)."""
    found = [i for s in stops if s and (i := text.find(s, max(0, sent - len(s) + 1))) >= 0]
    return min(found) if found else None


def _safe_end(text: str, stops: tuple[str, ...]) -> int:
    """How much of ``text`` can be shown: not a trailing partial character (a byte-level token may end inside one),
    nor a tail that could still grow into a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    held = max((k for stop in stops for k in range(1, min(len(stop) - 1, end) + 1)
                if text[:end].endswith(stop[:k])), default=0)
    return end - held
