"""What the DeepSpeed engine refuses beyond spec.check_plan (which holds the refusals the web app shows).
Pure: no deepspeed import, so the launcher can refuse before starting anything."""
from __future__ import annotations

from trainer.contract import ModelSpec, ParallelPlan, check_plan


def unsupported(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    # check_plan and ParallelPlan.problems already refuse tp/sp, pp with ZeRO ≥ 2, MoE with ZeRO-3; repeat them
    # here as sentences so a spec written by hand and run directly still fails before launch.
    reasons = [m for ms in plan.problems().values() for m in ms]
    reasons += [m for key, ms in check_plan(model, plan).items() if key != "" for m in ms]
    return reasons
