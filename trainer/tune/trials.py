"""Short real trials of the best-estimated plans, and when to stop measuring.

Strategy: measure plans in order of estimated step time. Each measurement gives a ratio r = measured / estimated.
With r_lo = min(r)·(1 − δ), δ = max(spread of the observed ratios, the calibrated error bound), no unmeasured plan j
can run faster than est_j · r_lo. Plans are taken in estimate order, so once the next one satisfies
    est_next · r_lo ≥ best_measured / (1 + tolerance)
no unmeasured plan can beat the best measured by more than the tolerance and the trials stop. They also stop at the
budget, ⌊max_fraction · pool⌋ measurements (at least ``min_trials`` before the bound is trusted). The pick is the best
measured plan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from trainer.spec import ParallelPlan, SpecError


@dataclass
class TrialResult:
    pool: int
    budget: int
    measured: list = field(default_factory=list)   # Candidates with measured_step_time_s, in measuring order
    best: Any = None
    stopped: str = ""                                # "bound", "budget" or "pool"
    ratio_low: float = 0.0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "budget": self.budget, "measured": [c.to_dict() for c in self.measured],
                "best": self.best.to_dict() if self.best else None, "stopped": self.stopped,
                "ratio_low": self.ratio_low, "note": self.note}


def run_trials(pool: Sequence, measure: Callable[[ParallelPlan], float], max_fraction: float = 1 / 3,
               tolerance: float = 0.05, progress: Callable[[dict], None] | None = None, error_bound: float = 0.0,
               min_trials: int = 3) -> TrialResult:
    """Measure the pool's plans (Candidates sorted by estimate) until the bound or the budget says stop."""
    if not 0 < max_fraction <= 1:
        raise SpecError.single("max_fraction", f"max_fraction={max_fraction} must be in (0, 1]")
    if tolerance < 0 or error_bound < 0:
        raise SpecError.single("tolerance", "tolerance and error_bound must not be negative")
    pool = sorted(pool, key=lambda c: c.step_time_s)
    budget = max(1, math.floor(len(pool) * max_fraction))
    result = TrialResult(pool=len(pool), budget=budget)
    ratios: list[float] = []
    for i, cand in enumerate(pool):
        if len(result.measured) >= budget:
            result.stopped = "budget"
            break
        seconds = float(measure(cand.plan))
        if not seconds > 0 or math.isinf(seconds):
            raise ValueError(f"measure() returned {seconds!r} for a plan; expected a positive step time in seconds")
        done = replace(cand, measured_step_time_s=seconds)
        result.measured.append(done)
        ratios.append(seconds / cand.step_time_s)
        if result.best is None or seconds < result.best.measured_step_time_s:
            result.best = done
        if progress:
            progress({"phase": "trial", "done": len(result.measured), "budget": budget, "pool": len(pool),
                      "measured_step_time_s": seconds, "estimated_step_time_s": cand.step_time_s,
                      "best_measured_s": result.best.measured_step_time_s})
        spread = (max(ratios) - min(ratios)) / max(ratios)
        result.ratio_low = min(ratios) * (1 - max(spread, error_bound))
        if i + 1 < len(pool) and len(result.measured) >= min(min_trials, budget):
            nxt = pool[i + 1]
            if nxt.step_time_s * result.ratio_low >= result.best.measured_step_time_s / (1 + tolerance):
                result.stopped = "bound"
                break
    else:
        result.stopped = "pool"
    result.note = (f"measured {len(result.measured)} of {len(pool)} plans (budget {budget}); stopped by "
                   f"{result.stopped}: " + ("no unmeasured plan can beat the best measured by more than "
                                            f"{tolerance:.0%} under ratio bound {result.ratio_low:.3f}"
                                            if result.stopped == "bound" else "the bound was not reached; the pick "
                                            "is the best measured plan"))
    return result
