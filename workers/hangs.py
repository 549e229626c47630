"""A hung collective, told from the ranks' heartbeats (trainer.engine.heartbeat; docs/operations.md, When a run fails).

A rank that waits in a collective for a rank that never comes keeps beating but makes no progress; the rank that
never comes is frozen (its beat has grown old: a stopped process, a kernel that does not return, a lost node) or
behind the others. The job is hung when no rank has made progress for longer than ``multiple`` × the median step
time, and never less than ``least_s``. Starting, evaluating and saving are not judged: they may rightly take far
longer than a step; nor is the first step of an attempt, which compiles, allocates and warms up for as long as it
takes (a collective that hangs there ends at the process group's own timeout, ten minutes, as a failure).
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.contract.records import Heartbeat, Phase

STALE_BEATS = 3  # beats a rank may miss before it counts as frozen


@dataclass(frozen=True)
class Hang:
    stuck: tuple[tuple[int, str], ...]   # (rank, host) of the ranks the others wait for
    why: str                             # how those were told apart
    step: int                            # the step the job is stuck in (steps done before it)
    silent_s: float                      # since the last progress of any rank
    limit_s: float
    median_step_s: float

    @property
    def message(self) -> str:
        ranks = ", ".join(f"rank {rank} on {host}" for rank, host in self.stuck)
        return (f"hung in step {self.step + 1}: no progress for {self.silent_s:.0f} s (limit {self.limit_s:.0f} s; "
                f"a step takes {self.median_step_s:.3g} s); stuck: {ranks} ({self.why})")

    def to_dict(self) -> dict:
        return {"stuck": [{"rank": rank, "host": host} for rank, host in self.stuck], "why": self.why,
                "step": self.step, "silent_s": round(self.silent_s, 1), "limit_s": round(self.limit_s, 1),
                "median_step_s": self.median_step_s}


def find_hang(beats: list[Heartbeat], now: float, since: float, multiple: float, least_s: float) -> Hang | None:
    """The hang the heartbeats show at ``now``, or None. ``since``: when the current attempt was submitted (an
    earlier attempt's beats are older and left out)."""
    beats = [b for b in beats if b.process_started >= since]
    if not beats or len(beats) < beats[0].world_size:
        return None  # not every rank has started: a rendezvous may take its time
    frozen = [b for b in beats if now - b.time > STALE_BEATS * b.every_s]
    if any(b.phase != Phase.STEP for b in beats if b not in frozen):
        return None  # a live rank is starting, evaluating, saving or done: not waiting in a collective
    medians = sorted(b.median_step_s for b in beats if b.median_step_s)
    if not medians:
        return None  # no step done yet in this attempt: the first is not judged
    median = medians[len(medians) // 2]
    limit = max(least_s, multiple * median)
    silent = now - max(b.phase_since for b in beats)
    if silent <= limit:
        return None
    step = min(b.step for b in beats)
    if frozen:
        stuck, why = frozen, f"no heartbeat for {now - max(b.time for b in frozen):.0f} s: frozen or gone"
    elif any(b.step > step for b in beats):
        stuck, why = [b for b in beats if b.step == step], "behind the others"
    else:
        stuck, why = beats, "every rank waits in the same step"
    return Hang(tuple((b.rank, b.host) for b in stuck), why, step, silent, limit, median)
