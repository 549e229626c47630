"""What the serving engine does each iteration, decided without the model: the scheduler keeps the waiting and
running requests, the slots and the prefix cache's bookkeeping, and says in a plan (plain data) what the model runs.

Each iteration the engine asks ``schedule()`` for a plan, the model executes it (``ServingGPT.execute``), rank 0
draws a token for each row that ends with one, and ``update(plan, output)`` hands the tokens to their requests:
1. admissions: waiting requests take free slots, lowest first; a prompt whose first whole blocks are in the prefix
   cache starts with those blocks copied into its slot, and only the rest is computed;
2. prefills: the prompts not computed yet, up to ``prefill_chunk`` tokens in all, in arrival order, in batches of
   rows of similar length; a longer prompt takes the rest in the next iterations, between decode steps, so running
   streams keep flowing; a prompt that is complete gives its first token, and its new whole blocks are saved into
   the prefix cache;
3. decode: one step over every sequence that has its first token, one new token each, whatever their lengths;
4. the update streams each token to its request at once or keeps it for the one final answer; a sequence that
   reached max_tokens, the end-of-text token or a stop string leaves its slot. A cancelled request leaves its slot
   at the next schedule, before the admissions, so a waiting request takes it in the same plan.
So a new request joins between two steps instead of waiting for the batch to drain, and a cancelled one stops within
one step. A sequence that fills the context window is started again over its last seq_len − 1 tokens (a restart),
as the trainer's generation does, so both produce the same tokens.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

from .prefix_cache import PREFIX_BLOCK_SIZE, PrefixCache
from .request import Request, Result, Sampling, TokenLogprob

PREFILL_CHUNK = 512  # prompt tokens computed in one iteration, at most (a longer prompt takes several)


@dataclass(frozen=True)
class Admission:
    slot: int
    blocks: list[int]  # prefix-cache blocks copied in as the slot's first positions (none: the slot starts empty)
    sampling: Sampling = Sampling()  # for rank 0, which draws the tokens; the other ranks never see it
    guided: Optional[Any] = None     # for rank 0 too: the request's grammar, where it asked for one


@dataclass(frozen=True)
class Batch:
    """One model call: chunks[i] appended to slot slots[i]; the rows in ``draws`` end where a token is drawn. Rows
    in ``scored`` (prompts whose log-probabilities were asked for) are scored at every position: ``targets`` holds,
    for each, the prompt's tokens that follow the chunk's positions (one fewer where the chunk ends the prompt: the
    drawn token follows it)."""

    slots: list[int]
    chunks: list[list[int]]
    draws: list[int]
    scored: list[int] = field(default_factory=list)
    targets: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class BlockSave:
    """The slot's positions of its blocks first, first + 1, … copied into prefix-cache blocks ``blocks``."""

    slot: int
    first: int
    blocks: list[int]


@dataclass(frozen=True)
class Plan:
    """One iteration, executed in this order: admissions, restarts (slots started over empty), prefills, saves (after
    the prefills that computed them), the decode step."""

    admissions: list[Admission] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)
    prefills: list[Batch] = field(default_factory=list)
    saves: list[BlockSave] = field(default_factory=list)
    decode: Optional[Batch] = None

    @property
    def batches(self) -> list[Batch]:
        """The model calls, in order: each gives one row of logits per chunk."""
        return self.prefills + ([self.decode] if self.decode is not None else [])

    def __bool__(self) -> bool:
        return bool(self.admissions or self.restarts or self.prefills or self.saves or self.decode)

    def to_ints(self) -> list[int]:
        """The plan as one list of ints (what a tensor-parallel leader broadcasts), less what only rank 0 needs to
        draw and score tokens (the sampling, the scored rows)."""
        out = [len(self.admissions)]
        for a in self.admissions:
            out += [a.slot, len(a.blocks), *a.blocks]
        out += [len(self.restarts), *self.restarts, len(self.batches), int(self.decode is not None)]
        for b in self.batches:
            out += [len(b.slots), *b.slots, *(len(c) for c in b.chunks), len(b.draws), *b.draws,
                    *(t for c in b.chunks for t in c)]
        out.append(len(self.saves))
        for s in self.saves:
            out += [s.slot, s.first, len(s.blocks), *s.blocks]
        return out

    @classmethod
    def from_ints(cls, values: list[int]) -> "Plan":
        read = _Reader(values)
        admissions = [Admission(read.one(), read.many(read.one())) for _ in range(read.one())]
        restarts = read.many(read.one())
        n, has_decode = read.one(), read.one()
        batches = []
        for _ in range(n):
            rows = read.one()
            slots, lengths, draws = read.many(rows), read.many(rows), read.many(read.one())
            batches.append(Batch(slots, [read.many(length) for length in lengths], draws))
        saves = [BlockSave(read.one(), read.one(), read.many(read.one())) for _ in range(read.one())]
        prefills, decode = (batches[:-1], batches[-1]) if has_decode else (batches, None)
        return cls(admissions, restarts, prefills, saves, decode)


class _Reader:
    def __init__(self, values: list[int]):
        self.values, self.at = values, 0

    def one(self) -> int:
        self.at += 1
        return self.values[self.at - 1]

    def many(self, n: int) -> list[int]:
        self.at += n
        return self.values[self.at - n:self.at]


@dataclass(frozen=True)
class Output:
    tokens: dict[int, int]  # slot → the token drawn for it (the rows in a batch's draws)
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)  # slot → its drawn token's, where asked
    prompt_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)  # slot → its scored chunk's


class Codec(Protocol):
    eos_id: Optional[int]

    def decode(self, ids: Sequence[int]) -> str: ...


class Metrics(Protocol):
    def first_token(self, seconds: float) -> None: ...

    def decode_step(self, batch_size: int) -> None: ...

    def prefill_step(self, sequences: int, tokens: int) -> None: ...

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

    def decode_step(self, batch_size: int) -> None:
        self.batch_sizes.append(batch_size)

    def prefill_step(self, sequences: int, tokens: int) -> None:
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
    generated: list[int] = field(default_factory=list)
    sent: int = 0  # characters of the text already streamed
    first_at: float = 0.0
    done: bool = False
    start: int = 0   # the slot holds (or, once the plan runs, will hold) context[start:start + cached]
    cached: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)         # of the generated tokens, where asked
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # of the prompt's tokens after the first

    @property
    def scores_prompt(self) -> bool:
        return self.request.sampling.prompt_logprobs >= 0

    @property
    def pending(self) -> list[int]:
        """Tokens still to run through the model before the next token: a prompt's (or its rest), or the last
        token drawn."""
        return self.context[self.start + self.cached:]


class Scheduler:
    def __init__(self, slots: int, seq_len: int, codec: Codec, metrics: Optional[Metrics] = None,
                 prefill_chunk: int = PREFILL_CHUNK, prefix_blocks: int = 0,
                 block_size: int = PREFIX_BLOCK_SIZE):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk={prefill_chunk}: a prefill must take at least one token an iteration")
        self.seq_len, self.codec, self.prefill_chunk = seq_len, codec, prefill_chunk
        self.metrics = metrics or CountingMetrics()
        self._prefix_shape = (prefix_blocks, block_size)
        self.prefix = PrefixCache(prefix_blocks, block_size) if prefix_blocks else None
        self._lock = threading.Lock()  # requests arrive from other threads
        self._waiting: deque[Request] = deque()
        self._running: dict[int, _Sequence] = {}  # by slot, in admission order
        self._free = list(range(slots))

    # -- requests in ---------------------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        problems = request.problems()
        if problems:
            request.sink.on_error("; ".join(problems))
            return
        with self._lock:
            self._waiting.append(request)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._waiting or self._running)

    # -- deciding ------------------------------------------------------------------------------------------------
    def schedule(self) -> Plan:
        """What the model runs this iteration; the sequences' state moves as if it ran (``update`` then hands out
        the tokens drawn)."""
        for seq in list(self._running.values()):
            if seq.request.sink.is_cancelled():
                self._finish(seq, "cancelled")  # its slot is free for this plan's admissions
        admissions = self._admit()
        restarts, prefilling, decoding = [], [], []
        for seq in self._running.values():
            if seq.cached >= self.seq_len:  # the window is full: start over on its tail (prefilled again)
                seq.start, seq.cached = len(seq.context) - (self.seq_len - 1), 0
                restarts.append(seq.slot)
            (decoding if len(seq.pending) == 1 else prefilling).append(seq)
        prefills, saves = self._prefill(prefilling)
        decode = None
        if decoding:
            decoding.sort(key=lambda s: s.slot)  # consecutive slots are read in place (ServingGPT.extend)
            decode = Batch([s.slot for s in decoding], [s.pending for s in decoding], list(range(len(decoding))))
            for seq in decoding:
                seq.cached += 1
        return Plan(admissions, restarts, prefills, saves, decode)

    def _admit(self) -> list[Admission]:
        admissions = []
        while self._free:
            with self._lock:
                if not self._waiting:
                    break
                request = self._waiting.popleft()
            if request.sink.is_cancelled():
                request.sink.on_finish(Result("", [], len(request.prompt_ids), 0, "cancelled"))
                continue
            slot = min(self._free)  # the lowest free slot keeps the active ones consecutive (read in place)
            self._free.remove(slot)
            seq = _Sequence(request, slot, list(request.prompt_ids)[-self.seq_len:])
            # A prompt to be scored is computed whole: cached blocks would skip its positions' logits.
            blocks = self.prefix.match(seq.context) if self.prefix is not None and not seq.scores_prompt else []
            if self.prefix is not None and not seq.scores_prompt:
                seq.cached = len(blocks) * self.prefix.block_size
                self.metrics.prefix_lookup(len(seq.context), seq.cached)
            self._running[slot] = seq
            admissions.append(Admission(slot, blocks, request.sampling, request.guided))
        return admissions

    def _prefill(self, sequences: list[_Sequence]) -> tuple[list[Batch], list[BlockSave]]:
        """The next chunk of each prompt in arrival order while the iteration's budget lasts, in batches of rows
        of similar length (padding at most doubles a batch's work); and the saves of the prompts they complete."""
        budget, chunks, saves = self.prefill_chunk, [], []
        targets: dict[int, list[int]] = {}  # slot → what its chunk's positions are scored against
        for seq in sequences:
            if budget == 0:
                break
            chunk = seq.pending[:budget]
            if seq.scores_prompt and not seq.generated:  # not a restart's prefill
                first = seq.start + seq.cached + 1
                targets[seq.slot] = seq.context[first:first + len(chunk)]
            seq.cached += len(chunk)
            chunks.append((seq, chunk))
            budget -= len(chunk)
            if not seq.pending and not seq.generated and self.prefix is not None:
                saves += self._remember_prompt(seq)
        batches = []
        for rows in _similar_lengths(chunks):
            scored = [i for i, (seq, _) in enumerate(rows) if seq.slot in targets]
            batches.append(Batch([seq.slot for seq, _ in rows], [chunk for _, chunk in rows],
                                 [i for i, (seq, _) in enumerate(rows) if not seq.pending], scored,
                                 [targets[rows[i][0].slot] for i in scored]))
        return batches, saves

    def _remember_prompt(self, seq: _Sequence) -> list[BlockSave]:
        """Enter the prompt's whole blocks into the prefix cache, to be copied from the slot where it lacks them.
        Once a block is new, so is every one after it (each is keyed by its parent), so the new ones are
        consecutive."""
        stores = self.prefix.add(seq.context)
        return [BlockSave(seq.slot, stores[0][0], [block for _, block in stores])] if stores else []

    # -- tokens out ----------------------------------------------------------------------------------------------
    def update(self, plan: Plan, output: Output) -> None:
        """Hand each token drawn to its request, in the plan's order; finish the sequences that stop."""
        for batch in plan.prefills:
            self.metrics.prefill_step(len(batch.slots), sum(map(len, batch.chunks)))
            for row in batch.scored:
                slot = batch.slots[row]
                self._running[slot].prompt_logprobs += output.prompt_logprobs.get(slot, [])
            self._emit_all(batch, output)
        if plan.decode is not None:
            self.metrics.decode_step(len(plan.decode.slots))
            self._emit_all(plan.decode, output)
        self.metrics.active(len(self._running))

    def _emit_all(self, batch: Batch, output: Output) -> None:
        for row in batch.draws:
            slot = batch.slots[row]
            self._emit(self._running[slot], output.tokens[slot], output.logprobs.get(slot))

    def _emit(self, seq: _Sequence, token: int, logprob: Optional[TokenLogprob] = None) -> None:
        request = seq.request
        if not seq.generated:
            seq.first_at = time.perf_counter()
            self.metrics.first_token(seq.first_at - request.arrived)
        seq.generated.append(token)
        seq.context.append(token)
        if logprob is not None:
            seq.logprobs.append(logprob)
        if token == self.codec.eos_id:
            self._finish(seq, "stop")
            return
        text = self.codec.decode(seq.generated)
        cut = _first_stop(text, request.stop, seq.sent)
        if cut is not None:
            self._send(seq, text[:cut], token, logprob)
            self._finish(seq, "stop", text[:cut])
        elif len(seq.generated) >= request.max_tokens:
            self._send(seq, text, token, logprob)
            self._finish(seq, "length", text)
        else:
            self._send(seq, text[:_safe_end(text, request.stop)], token, logprob)

    def _send(self, seq: _Sequence, upto: str, token: int, logprob: Optional[TokenLogprob]) -> None:
        """Stream the text not yet sent, up to ``upto`` (held back: a partial character, a possible stop string)."""
        if seq.request.stream:
            delta = upto[seq.sent:] if len(upto) > seq.sent else ""
            seq.sent = max(seq.sent, len(upto))
            seq.request.sink.on_token(delta, token, logprob)

    def _finish(self, seq: _Sequence, reason: str, text: Optional[str] = None) -> None:
        self._release(seq)
        ids = [t for t in seq.generated if t != self.codec.eos_id]
        if text is None:
            text = self.codec.decode(ids)
            if reason == "cancelled" and seq.request.stop:
                text = text[:_safe_end(text, seq.request.stop)]
        if seq.generated:
            self.metrics.finished(len(seq.generated), time.perf_counter() - seq.first_at, reason)
        unsent = text[seq.sent:] if seq.request.stream else ""
        sampling = seq.request.sampling
        seq.request.sink.on_finish(Result(text, seq.generated, len(seq.request.prompt_ids), len(seq.generated),
                                          reason, unsent, seq.logprobs if sampling.logprobs >= 0 else None,
                                          seq.prompt_logprobs if seq.scores_prompt else None))

    def _release(self, seq: _Sequence) -> None:
        seq.done = True
        del self._running[seq.slot]
        self._free.append(seq.slot)

    def fail_all(self, message: str) -> None:
        """Every request, running or waiting, ends with ``message``. The prefix cache starts empty: the plan that
        failed may not have copied the blocks it entered."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
        for seq in list(self._running.values()):
            self._release(seq)
            seq.request.sink.on_error(message)
        for request in waiting:
            request.sink.on_error(message)
        if self.prefix is not None:
            self.prefix = PrefixCache(*self._prefix_shape)


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
