"""``advise(model, cluster, plan=None)``: every suggestion for one model on one cluster, under its plan (or the
tuner's best plan when none is given)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError
from trainer.planner.advice.figures import Assessor, Figures
from trainer.planner.advice.plans import require_plan
from trainer.planner.advice.suggestions import SUGGESTIONS, Context, Suggestion
from trainer.planner.estimate.explain import validate_inputs
from trainer.planner.estimate.options import EstimateOptions

# Sequences a step per GPU when neither a plan nor a global batch is given.
DEFAULT_SEQUENCES_PER_GPU = 8
MAX_GLOBAL_BATCH = 10_000_000


@dataclass
class Advice:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    plan_source: str                  # "given" or "tuned"
    baseline: Figures
    suggestions: list[Suggestion]
    tile_model: bool                  # whether the GPU's tile figures refined the compute term
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "cluster": self.cluster.to_dict(), "plan": self.plan.to_dict(),
                "plan_source": self.plan_source, "baseline": self.baseline.to_dict(), "tile_model": self.tile_model,
                "suggestions": [s.to_dict() for s in self.suggestions], "notes": list(self.notes)}


def _check(model, cluster, plan, global_batch) -> None:
    if plan is not None:
        validate_inputs(model, plan, cluster)
        return
    problems: dict[str, list[str]] = {}
    for name, obj, cls in (("model", model, ModelSpec), ("cluster", cluster, ClusterSpec)):
        if not isinstance(obj, cls):
            raise SpecError.single(name, f"expected a {cls.__name__}, got {type(obj).__name__}")
        for key, messages in obj.problems().items():
            if messages:
                problems[f"{name}.{key}" if key else name] = messages
    if global_batch is not None and (not isinstance(global_batch, int) or isinstance(global_batch, bool)
                                     or not 1 <= global_batch <= MAX_GLOBAL_BATCH):
        problems["global_batch"] = [f"global_batch={global_batch!r} must be an integer from 1 to "
                                    f"{MAX_GLOBAL_BATCH:,}"]
    if problems:
        raise SpecError(problems)


def advise(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan | None = None,
           options: EstimateOptions | None = None, global_batch: int | None = None) -> Advice:
    """Suggestions for ``model`` on ``cluster``: vocabulary padding, width alignment, heads for tensor parallel,
    depth against width, MoE against dense, micro-batch and sequence length, each with the planner's figures
    before and after. Without ``plan`` the tuner's best plan at ``global_batch`` (default 8 sequences a GPU) is
    used. Bad input raises SpecError naming the field and the number."""
    _check(model, cluster, plan, global_batch)
    options = (options or EstimateOptions()).validate()
    source = "given"
    if plan is None:
        plan = require_plan(model, cluster, global_batch or DEFAULT_SEQUENCES_PER_GPU * cluster.world_size, options)
        source = "tuned"
    assessor = Assessor(model, plan, cluster, options)
    base = assessor.figures(model, plan)
    ctx = Context(model, plan, cluster, options, assessor, base)
    suggestions = [s for s in (make(ctx) for make in SUGGESTIONS) if s is not None]
    notes = []
    if assessor.tiles is None:
        notes.append(f"no tile figures for {cluster.gpu.name!r}: every figure is the planner's own, without the "
                     f"matmul-shape refinement")
    if not base.fits:
        notes.append("the asked-about plan does not fit in GPU memory: its figures are for comparison only")
    return Advice(model, cluster, plan, source, base, suggestions, assessor.tiles is not None, notes)
