"""A run whose job ran out of memory goes on with the plan the planner chooses next (trainer.planner.replan: the
same layout and global batch, a smaller micro-batch or more recompute), from its newest checkpoint, unless its owner
turned re-planning off. The run's spec and its folder's spec.json change together: the next attempt launches with
the new plan, and the history says what changed and why."""
from __future__ import annotations

from pathlib import Path

from trainer.contract.runfolder import SPEC, write_json_atomic
from trainer.planner.replan import Replan, plan_after_oom
from webapp.models import Run


def replan(run: Run) -> Replan | None:
    """The run re-planned (its spec and spec.json rewritten; the caller saves the run), or None when its owner
    turned re-planning off or no plan of its layout needs enough less memory."""
    if not run.replan_on_oom:
        return None
    spec = run.run_spec()
    found = plan_after_oom(spec.model, spec.plan, spec.cluster)
    if found is None:
        return None
    changed = spec.replace(plan=found.plan)
    write_json_atomic(Path(run.run_dir) / SPEC, changed.to_dict())
    run.spec = changed.to_dict()
    return found


def no_replan_reason(run: Run) -> str:
    if not run.replan_on_oom:
        return ("re-planning is off for this run (replan_on_oom): give it a plan with a smaller micro-batch or more "
                "activation checkpointing")
    return ("no plan of the same layout and global batch needs enough less memory: use more GPUs, ZeRO or FSDP, "
            "tensor or pipeline parallelism, or a smaller model")
