"""The plan to try after a job ran out of memory: the same layout (dp, tp, pp, cp, ep, ZeRO stage, engine, precision)
and global batch, so that the run goes on from its checkpoint as it was and trains on the same batches, with a
smaller micro-batch (more of them accumulated) or more recompute.

Of those the planner estimates at no more than STEP_DOWN of the failed plan's peak memory, the fastest. A plan that
only just fits the estimate rarely fits where the last one did not: the step down is meant to be felt. A plan that
runs out of memory again is stepped down again from there, until none is left.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan
from trainer.contract.rules import check_plan
from trainer.planner.estimate.core import Planner

STEP_DOWN = 0.85
RECOMPUTE = ("none", "selective", "full")  # from least to most recompute


@dataclass(frozen=True)
class Replan:
    plan: ParallelPlan
    peak_bytes: float        # the planner's estimate, per GPU
    was_peak_bytes: float    # the failed plan's
    step_s: float
    was_step_s: float

    def describe(self, was: ParallelPlan) -> str:
        changes = [f"{name} {getattr(was, name)} → {getattr(self.plan, name)}"
                   for name in ("micro_batch", "activation_checkpointing")
                   if getattr(was, name) != getattr(self.plan, name)]
        return (f"re-planned: {', '.join(changes)} (estimated peak memory {self.was_peak_bytes / 1e9:.2f} → "
                f"{self.peak_bytes / 1e9:.2f} GB a GPU, step {self.was_step_s:.3g} → {self.step_s:.3g} s), the "
                f"global batch kept at {self.plan.global_batch}")

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "peak_bytes": self.peak_bytes, "was_peak_bytes": self.was_peak_bytes,
                "step_s": self.step_s, "was_step_s": self.was_step_s}


def plan_after_oom(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> Optional[Replan]:
    """The next plan for ``plan``, which ran out of memory; None when no plan of its layout needs enough less."""
    planner = Planner(model, cluster)
    was = planner.quick(plan)
    found = []
    for micro_batch in (m for m in range(plan.micro_batch, 0, -1) if plan.micro_batch % m == 0):
        for recompute in RECOMPUTE[RECOMPUTE.index(plan.activation_checkpointing):]:
            candidate = plan.replace(micro_batch=micro_batch, activation_checkpointing=recompute)
            if candidate == plan or check_plan(model, candidate, cluster):
                continue
            figures = planner.quick(candidate)
            if figures.peak_bytes <= STEP_DOWN * was.peak_bytes:
                found.append((figures.step_s, -figures.peak_bytes, micro_batch, figures, candidate))
    if not found:
        return None
    *_, figures, best = min(found, key=lambda f: f[:3])
    return Replan(best, figures.peak_bytes, was.peak_bytes, figures.step_s, was.step_s)
