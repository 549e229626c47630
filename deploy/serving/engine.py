"""The serving engine: iteration-level (continuous) batching over a slot cache.

One loop serves every request. Each iteration
1. admits waiting requests into free slots; a prompt whose first whole blocks are in the prefix cache starts with
   their keys and values copied into its slot, and only the rest is computed;
2. prefills: the prompts not computed yet, up to ``prefill_chunk`` tokens in all, in one batch (rows of similar
   length padded together); a longer prompt takes the rest in the next iterations, between decode steps, so running
   streams keep flowing; a prompt that is complete gives its first token, and its whole blocks enter the cache;
3. runs one decode step over every sequence that has its first token, one new token each, whatever their lengths;
4. hands each sequence's token to its request: streamed at once, or kept for the one final answer; a sequence that
   reached max_tokens, the end-of-text token or a stop string, or whose request was cancelled, leaves its slot.
So a new request joins between two steps instead of waiting for the batch to drain, and a cancelled one stops within
one step. A sequence that fills the context window is started again over its last seq_len − 1 tokens, as the
trainer's generation does, so both produce the same tokens.

Batching, chunking and the cache change where keys and values are computed, never what: a token attends to the same
positions with the same values (``model.ServingGPT.extend``), so greedy tokens are those of one prompt at a time.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

import torch

from .prefix_cache import PrefixCache
from .sampling import Sampling, generator_for, pick

PREFILL_CHUNK = 512  # prompt tokens computed in one iteration, at most (a longer prompt takes several)


class Runner(Protocol):
    """The model as the engine drives it (``ServingGPT``, or rank 0 of a tensor-parallel group)."""

    slots: int
    prefix_blocks: int  # the prefix cache's blocks (0: no cache)
    block_size: int

    def extend(self, slots: list[int], chunks: list[list[int]]) -> torch.Tensor: ...

    def truncate(self, slot: int, length: int) -> None: ...

    def save_blocks(self, slot: int, first: int, blocks: list[int]) -> None: ...

    def load_blocks(self, slot: int, blocks: list[int]) -> None: ...


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

    def prefill_step(self, sequences: int, tokens: int, seconds: float) -> None: ...

    def prefix_lookup(self, prompt_tokens: int, cached_tokens: int) -> None: ...

    def finished(self, completion_tokens: int, decode_seconds: float, reason: str) -> None: ...

    def active(self, sequences: int) -> None: ...


class CountingMetrics:
    """What the engine did, kept in memory (tests, benchmarks); the Triton model reports the same to Triton."""

    def __init__(self):
        self.first_tokens: list[float] = []
        self.batch_sizes: list[int] = []
        self.prefills: list[tuple[int, int]] = []  # (sequences, tokens) of each prefill batch
        self.prefix_lookups = self.prefix_hits = self.prefix_hit_tokens = 0
        self.tokens = 0
        self.reasons: list[str] = []
        self.active_now = 0

    def first_token(self, seconds: float) -> None:
        self.first_tokens.append(seconds)

    def decode_step(self, batch_size: int, seconds: float) -> None:
        self.batch_sizes.append(batch_size)

    def prefill_step(self, sequences: int, tokens: int, seconds: float) -> None:
        self.prefills.append((sequences, tokens))

    def prefix_lookup(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prefix_lookups += 1
        self.prefix_hits += cached_tokens > 0
        self.prefix_hit_tokens += cached_tokens

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
    start: int = 0   # the slot holds context[start:start + cached]; start moves when the window slides
    cached: int = 0

    @property
    def pending(self) -> list[int]:
        """Tokens still to run through the model before the next token: a prompt's (or its rest), or the last
        token drawn."""
        return self.context[self.start + self.cached:]


class Engine:
    def __init__(self, runner: Runner, codec: Codec, seq_len: int, metrics: Optional[Metrics] = None,
                 device: torch.device | str = "cpu", prefill_chunk: int = PREFILL_CHUNK):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={prefill_chunk}: a prefill must take at least one token an iteration")
        self.runner, self.codec, self.seq_len = runner, codec, seq_len
        self.metrics = metrics or CountingMetrics()
        self.device = torch.device(device)
        self.prefill_chunk = prefill_chunk
        self.prefix = PrefixCache(runner.prefix_blocks, runner.block_size) if runner.prefix_blocks else None
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
        """Admit what fits, prefill up to prefill_chunk prompt tokens, then one decode step."""
        self._admit()
        prefilling: list[_Sequence] = []
        decoding: list[_Sequence] = []
        for seq in self._active:
            if seq.request.sink.is_cancelled():
                self._finish(seq, "cancelled")
                continue
            if seq.cached >= self.seq_len:  # the window is full: start over on its tail (prefilled again)
                seq.start, seq.cached = len(seq.context) - (self.seq_len - 1), 0
                self.runner.truncate(seq.slot, 0)
            (decoding if len(seq.pending) == 1 else prefilling).append(seq)
        if prefilling:
            self._prefill(prefilling)
        if decoding:
            decoding.sort(key=lambda s: s.slot)  # consecutive slots are read in place (ServingGPT.extend)
            started = time.perf_counter()
            logits = self.runner.extend([s.slot for s in decoding], [s.pending for s in decoding])
            self.metrics.decode_step(len(decoding), time.perf_counter() - started)
            for seq, token in zip(decoding, _draw(decoding, logits)):
                seq.cached += 1
                self._emit(seq, token)
        self._active = [s for s in self._active if not s.done]
        self.metrics.active(len(self._active))

    def _prefill(self, sequences: list[_Sequence]) -> None:
        """The next chunk of each prompt in arrival order while the iteration's budget lasts, in batches of rows
        of similar length (padding at most doubles a batch's work)."""
        budget, chunks = self.prefill_chunk, []
        for seq in sequences:
            if budget == 0:
                break
            chunk = seq.pending[:budget]
            chunks.append((seq, chunk))
            budget -= len(chunk)
        for batch in _similar_lengths(chunks):
            started = time.perf_counter()
            logits = self.runner.extend([s.slot for s, _ in batch], [c for _, c in batch])
            self.metrics.prefill_step(len(batch), sum(len(c) for _, c in batch), time.perf_counter() - started)
            for seq, chunk in batch:
                seq.cached += len(chunk)
            complete = [i for i, (seq, _) in enumerate(batch) if not seq.pending]  # their logits give a token
            if complete:
                for i, token in zip(complete, _draw([batch[i][0] for i in complete], logits[complete])):
                    self._emit(batch[i][0], token)

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
            blocks = self.prefix.match(seq.context) if self.prefix is not None else []
            if blocks:
                self.runner.load_blocks(slot, blocks)
                seq.cached = len(blocks) * self.prefix.block_size
            else:
                self.runner.truncate(slot, 0)
            if self.prefix is not None:
                self.metrics.prefix_lookup(len(seq.context), seq.cached)
            self._active.append(seq)

    def _remember_prompt(self, seq: _Sequence) -> None:
        """Enter the prompt's whole blocks into the prefix cache, copying those it lacks from the slot. Once a block
        is new, so is every one after it (each is keyed by its parent), so the new ones are consecutive."""
        stores = self.prefix.add(seq.context)
        if stores:
            self.runner.save_blocks(seq.slot, stores[0][0], [block for _, block in stores])

    # -- tokens out ----------------------------------------------------------------------------------------------
    def _emit(self, seq: _Sequence, token: int) -> None:
        request = seq.request
        if not seq.generated:
            if self.prefix is not None:  # the prompt is in the slot (a window slides only later)
                self._remember_prompt(seq)
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


def _draw(sequences: list[_Sequence], logits: torch.Tensor) -> list[int]:
    """Each row's next token: the greedy ones from one argmax over the batch (one read from the device), the
    sampled ones by their own rule and generator."""
    greedy = logits.argmax(dim=-1).tolist()
    return [greedy[i] if seq.request.sampling.greedy else pick(logits[i], seq.request.sampling, seq.generator)
            for i, seq in enumerate(sequences)]


def _similar_lengths(chunks: list[tuple[_Sequence, list[int]]]) -> list[list[tuple[_Sequence, list[int]]]]:
    """Longest first, a new batch wherever a chunk is under half the batch's longest; each batch in slot order."""
    batches: list[list[tuple[_Sequence, list[int]]]] = []
    for item in sorted(chunks, key=lambda c: -len(c[1])):
        if not batches or 2 * len(item[1]) < len(batches[-1][0][1]):
            batches.append([])
        batches[-1].append(item)
    return [sorted(batch, key=lambda c: c[0].slot) for batch in batches]


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
