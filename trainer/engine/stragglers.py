"""Stragglers: a rank whose own work takes longer than the others' holds every step back, and its step time does
not show it, since every rank's step ends in the same collectives. What shows it is the time each rank spends on
its own forward and backward before it waits for anyone (``ComputeClock``); rank 0 gathers it with each step's
figures, and ``StragglerWatch`` names a rank whose median over a window is a set factor above the other ranks'.

The clock stops when the backward has reached the model's first parameter, the last gradient a rank computes. Under
plain data parallelism (DDP, whose gradient reductions run in the background until the backward ends) that is this
rank's own work; where the backward itself waits on other ranks (tensor, pipeline and context parallelism, expert
all-to-alls, FSDP's gathers) it is not, and nothing is measured.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch

from trainer.contract import ParallelPlan


class ComputeClock:
    """From ``start()`` to the first parameter's gradient of the step's last backward (CUDA events on a GPU)."""

    def __init__(self, parameter: Optional[torch.nn.Parameter]):
        self.enabled = parameter is not None
        self.cuda = self.enabled and parameter.device.type == "cuda"
        self._start = self._end = None
        if self.enabled:
            parameter.register_post_accumulate_grad_hook(self._stop)

    @classmethod
    def for_plan(cls, plan: ParallelPlan, module: torch.nn.Module, fsdp: bool) -> "ComputeClock":
        alone = plan.tp == plan.pp == plan.cp == plan.ep == 1 and not fsdp
        return cls(next(module.parameters()) if alone else None)

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        if self.enabled:
            self._start, self._end = self._now(), None

    def _stop(self, _parameter) -> None:
        self._end = self._now()  # each micro-batch's backward: the last one's counts

    def read(self) -> Optional[float]:
        """The step's seconds (once the step is over), or None."""
        if self._start is None or self._end is None:
            return None
        if self.cuda:
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1000
        return self._end - self._start


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    compute_s: float   # its median over the window
    others_s: float    # the median of the other ranks' medians

    @property
    def ratio(self) -> float:
        return self.compute_s / self.others_s

    def describe(self, window: int) -> str:
        return (f"rank {self.rank} on {self.host} is a straggler: its own forward and backward take "
                f"{self.compute_s * 1000:.1f} ms, {self.ratio:.2f}× the other ranks' {self.others_s * 1000:.1f} ms "
                f"(medians over {window} steps)")


class StragglerWatch:
    """Every rank's compute seconds of each step, a window of them; a rank is named once when it is found slower
    than the others by ``factor``, and again only after it has caught up."""

    def __init__(self, factor: float, window: int, hosts: list[str]):
        self.factor, self.window, self.hosts = factor, window, hosts
        self.recent: deque[list[float]] = deque(maxlen=window)
        self.named: set[int] = set()

    def observe(self, compute_s: list[Optional[float]]) -> list[Straggler]:
        if not self.factor or len(self.hosts) < 2 or any(c is None for c in compute_s):
            return []
        self.recent.append(compute_s)
        if len(self.recent) < self.window:
            return []
        medians = [statistics.median(step[rank] for step in self.recent) for rank in range(len(self.hosts))]
        found = []
        for rank, mine in enumerate(medians):
            others = statistics.median(m for r, m in enumerate(medians) if r != rank)
            slow = others > 0 and mine > self.factor * others
            if slow and rank not in self.named:
                found.append(Straggler(rank, self.hosts[rank], mine, others))
            (self.named.add if slow else self.named.discard)(rank)
        return found
