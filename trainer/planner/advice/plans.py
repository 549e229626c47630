"""Which plan a model variant is judged under: the asked-about plan when the contract accepts it for the variant,
otherwise the best the tuner finds for the variant at the same global batch, precision and engine."""
from __future__ import annotations

import math

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError
from trainer.contract.rules import check_plan
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.tune.search import rank_plans
from trainer.planner.tune.space import SearchSpace, divisors

# Plans one tuning inside an advice may estimate: the advice tunes a handful of variants and answers in about a
# second even for the largest clusters the contract accepts.
ADVICE_MAX_PLANS = 20_000


def plan_problems(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> dict[str, list[str]]:
    """The plan's own problems and the contract's for this model and cluster; empty when the trainer runs it."""
    problems = {k: v for k, v in plan.problems().items() if v}
    if not problems:
        problems = {k: v for k, v in check_plan(model, plan, cluster).items() if v}
    return problems


def tuned_plan(model: ModelSpec, cluster: ClusterSpec, global_batch: int, options: EstimateOptions,
               like: ParallelPlan | None = None) -> ParallelPlan | None:
    """The tuner's fastest fitting plan (native engine and bf16 unless ``like`` says otherwise), or None."""
    space = SearchSpace(precisions=(like.precision,) if like else ("bf16",),
                        engines=(like.engine,) if like else ("native",), offload=False)
    ranking = rank_plans(model, cluster, global_batch, space, options, max_plans=ADVICE_MAX_PLANS)
    return ranking.ranked[0].plan if ranking.ranked else None


def expert_parallel_choices(model: ModelSpec, plan: ParallelPlan) -> list[ParallelPlan]:
    """For an MoE variant of a dense plan: the plan at each ep that divides both dp and the experts."""
    if not model.is_moe:
        return [plan.replace(ep=1)]
    return [plan.replace(ep=ep) for ep in divisors(math.gcd(plan.dp, model.n_experts))]


def plan_for(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec,
             options: EstimateOptions) -> tuple[list[ParallelPlan], str]:
    """Plans to judge ``model`` under and how they were chosen: the asked-about plan (at each valid ep for an MoE
    variant) when valid, else the tuner's pick; ([], why) when nothing fits."""
    same = [p for p in expert_parallel_choices(model, plan) if not plan_problems(model, p, cluster)]
    if same:
        return same, "the same plan" if len(same) == 1 else "the same plan at each expert-parallel degree"
    why = "; ".join(m for ms in plan_problems(model, expert_parallel_choices(model, plan)[0], cluster).values()
                    for m in ms)
    tuned = tuned_plan(model, cluster, plan.global_batch, options, like=plan)
    if tuned is None:
        return [], f"the plan does not apply ({why}) and no plan fits"
    return [tuned], f"re-planned by the tuner, since the plan does not apply: {why}"


def require_plan(model: ModelSpec, cluster: ClusterSpec, global_batch: int, options: EstimateOptions) -> ParallelPlan:
    plan = tuned_plan(model, cluster, global_batch, options)
    if plan is None:
        raise SpecError.single("plan", f"no plan of {model.name or 'the model'} fits the cluster's "
                                       f"{cluster.world_size} GPUs at global_batch={global_batch}; give a plan or "
                                       f"a larger cluster")
    return plan
