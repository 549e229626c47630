"""The serving engine: iteration-level (continuous) batching over a slot cache, as vLLM's engine core does it.

Each iteration is decide, run, hand out: the scheduler (``scheduler.Scheduler``, no torch) returns a plan of plain
data (admissions with their prefix blocks, prefill chunks batched by length, the decode step, restarts); the runner
executes it (``ServingGPT.execute``, or a tensor-parallel leader that broadcasts the plan to its followers first)
and gives the logits of each model call; the engine draws each row's token where the plan says one ends there
(after the request's penalties), scores it and the prompts the plan marks where log-probabilities were asked, and
the scheduler's ``update`` streams the tokens, stops and finishes the sequences.

Batching, chunking and the cache change where keys and values are computed, never what: a token attends to the same
positions with the same values (``model.ServingGPT.extend``), so greedy tokens are those of one prompt at a time.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional, Protocol

import torch

from .request import Request, Result, Sampling, TokenLogprob
from .sampling import generator_for, penalize, pick, scores
from .scheduler import PREFILL_CHUNK, Batch, Codec, CountingMetrics, Metrics, Output, Plan, Scheduler

if TYPE_CHECKING:
    from .guide import Guided
    from .model import BatchLogits

# what callers take from here
__all__ = ["PREFILL_CHUNK", "CountingMetrics", "Engine", "Request", "Result", "Runner", "TokenLogprob"]


class Runner(Protocol):
    """The model as the engine drives it (``ServingGPT``, or rank 0 of a tensor-parallel group)."""

    slots: int
    prefix_blocks: int  # the prefix cache's blocks (0: no cache)
    block_size: int

    def execute(self, plan: Plan) -> list[BatchLogits]:
        """Run the plan; the logits of each of ``plan.batches``."""
        ...


class Engine:
    def __init__(self, runner: Runner, codec: Codec, seq_len: int, metrics: Optional[Metrics] = None,
                 device: torch.device | str = "cpu", prefill_chunk: int = PREFILL_CHUNK):
        self.runner = runner
        self.scheduler = Scheduler(runner.slots, seq_len, codec, metrics, prefill_chunk, runner.prefix_blocks,
                                   runner.block_size)
        self.metrics = self.scheduler.metrics
        self.device = torch.device(device)
        self._sampling: dict[int, tuple[Sampling, Optional[torch.Generator]]] = {}  # by slot
        self._counts: dict[int, torch.Tensor] = {}  # by slot, where penalized: how often each token was generated
        self._guided: dict[int, Guided] = {}  # by slot, where a grammar holds the answer
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    @property
    def prefix(self):
        """The scheduler's prefix cache (None: none)."""
        return self.scheduler.prefix

    # -- requests in ---------------------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        with self._wake:
            self.scheduler.add(request)
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
                while not self._stopping and not self.scheduler.has_work():
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self.step()
            except Exception as exc:  # a failed step fails the sequences in it, never the server
                self.scheduler.fail_all(f"generation failed: {type(exc).__name__}: {exc}")
        self.scheduler.fail_all("the model is being unloaded")

    def busy(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> None:
        """One iteration: schedule, execute, update."""
        plan = self.scheduler.schedule()
        output = Output({})
        if plan:
            for admission in plan.admissions:
                self._sampling[admission.slot] = (admission.sampling,
                                                  generator_for(admission.sampling, self.device))
                self._counts.pop(admission.slot, None)
                self._guided.pop(admission.slot, None)
                if admission.guided is not None:
                    self._guided[admission.slot] = admission.guided
            for batch, logits in zip(plan.batches, self.runner.execute(plan)):
                self._draw(batch, logits.last, output)
                self._score_prompts(batch, logits.every, output)
        self.scheduler.update(plan, output)

    def _draw(self, batch: Batch, logits: torch.Tensor, output: Output) -> None:
        """The token of each row in the batch's draws: the greedy ones from one argmax over those rows (one read
        from the device), the sampled ones by their own rule and generator; and its log-probability where the
        request asked for it."""
        if not batch.draws:
            return
        if len(batch.draws) < len(batch.slots):
            logits = logits[batch.draws]
        greedy = logits.argmax(dim=-1).tolist()
        for i, row in enumerate(batch.draws):
            slot = batch.slots[row]
            sampling, generator = self._sampling[slot]
            guided = self._guided.get(slot)
            if sampling.penalized or guided is not None:
                token = self._draw_held(slot, logits[i], sampling, generator, guided)
            else:
                token = greedy[i] if sampling.greedy else pick(logits[i], sampling, generator)
            output.tokens[slot] = token
            if sampling.logprobs >= 0:
                output.logprobs[slot] = scores(logits[i:i + 1], [token], sampling.logprobs)[0]

    def _draw_held(self, slot: int, logits: torch.Tensor, sampling: Sampling, generator: Optional[torch.Generator],
                   guided: Optional[Guided]) -> int:
        """The token drawn from ``logits`` less the penalties of the slot's tokens so far, among those its grammar
        allows next; then counted, and followed in the grammar."""
        if sampling.penalized:
            counts = self._counts.setdefault(slot, torch.zeros_like(logits))
            logits = penalize(logits, counts, sampling)
        if guided is not None:
            logits = guided.allowed(logits)
        token = pick(logits, sampling, generator)
        if sampling.penalized:
            counts[token] += 1
        if guided is not None:
            guided.accept(token)
        return token

    def _score_prompts(self, batch: Batch, every: dict[int, torch.Tensor], output: Output) -> None:
        """Each scored row's prompt tokens under the logits of the positions before them."""
        for row, targets in zip(batch.scored, batch.targets):
            slot = batch.slots[row]
            output.prompt_logprobs[slot] = scores(every[row][:len(targets)], targets,
                                                  self._sampling[slot][0].prompt_logprobs)
