"""Search: enumerate valid plans, drop those that do not fit, rank the rest, find the memory/time Pareto front.

Ranking key: estimated seconds per token (step time / (B·s)); for one global batch that is the step-time order.
Plans are evaluated with ``estimate.core.Planner`` (plain numbers); the explained breakdown (``estimate``) is built
only for the plans shown.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from trainer.planner.estimate import flops as F
from trainer.planner.estimate.calibrate import StepTerms, plans_step_terms
from trainer.planner.estimate.core import GB, Planner, rank_of
from trainer.planner.estimate.explain import estimate
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError
from trainer.planner.tune.space import MAX_LISTED, SearchSpace, enumerate_plans
from trainer.planner.tune.trials import run_trials

Progress = Callable[[dict], None]

# The most plans one tune estimates (over all its global batches): about 4 s on one core. A space larger than
# this is a request to narrow, not to wait for; the ranking says it stopped and how to narrow the space.
MAX_PLANS = 200_000


@dataclass
class Candidate:
    plan: ParallelPlan
    step_time_s: float
    peak_memory_bytes: float
    peak_rank: int
    mfu: float
    tokens_per_s: float
    measured_step_time_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "step_time_s": self.step_time_s,
                "peak_memory_bytes": self.peak_memory_bytes, "peak_memory_gb": self.peak_memory_bytes / GB,
                "peak_rank": self.peak_rank, "mfu": self.mfu, "tokens_per_s": self.tokens_per_s,
                "measured_step_time_s": self.measured_step_time_s}


@dataclass
class TuneResult:
    model: ModelSpec
    cluster: ClusterSpec
    global_batches: tuple[int, ...]
    evaluated: int                      # valid plans estimated
    fitting: int
    rejected: dict[str, int]            # reason → count (rule violations pruned early, and memory)
    ranked: list[Candidate]             # fitting plans, fastest first (all of them)
    pareto: list[Candidate]             # no other plan is both faster and lighter
    elapsed_s: float
    top_k: int = 10
    details: list[dict] = field(default_factory=list)   # explained estimates of the top plans
    trials: Any = None                  # TrialResult when trials ran
    note: str = ""                      # why the ranking stopped short of the whole space, if it did

    @property
    def best(self) -> Candidate | None:
        if self.trials is not None and self.trials.best is not None:
            return self.trials.best
        return self.ranked[0] if self.ranked else None

    def to_dict(self, explain: bool = False) -> dict[str, Any]:
        out = {"model": self.model.to_dict(), "cluster": self.cluster.to_dict(),
               "global_batches": list(self.global_batches), "evaluated": self.evaluated, "fitting": self.fitting,
               "rejected": dict(sorted(self.rejected.items(), key=lambda kv: -kv[1])),
               "top": [c.to_dict() for c in self.ranked[:self.top_k]],
               "pareto": [c.to_dict() for c in self.pareto], "elapsed_s": self.elapsed_s,
               "best": self.best.to_dict() if self.best else None,
               "trials": self.trials.to_dict() if self.trials is not None else None, "note": self.note}
        if explain:
            out["details"] = self.details
        return out


def memory_reason(states: float, activations: float, capacity: float) -> str:
    """Why a plan does not fit, by the first part of the peak stage's memory that crosses the capacity."""
    if states > capacity:
        return "out of memory: model states alone exceed GPU memory"
    if states + activations > capacity:
        return "out of memory: activations exceed what model states leave"
    return "out of memory: buffers and overheads, at their most, exceed what is left"


def pareto_front(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Plans for which no other is at least as fast and strictly lighter, or strictly faster and as light."""
    front: list[Candidate] = []
    best_memory = float("inf")
    for c in sorted(candidates, key=lambda c: (c.step_time_s, c.peak_memory_bytes)):
        if c.peak_memory_bytes < best_memory:
            front.append(c)
            best_memory = c.peak_memory_bytes
    return front


@dataclass
class Ranking:
    ranked: list[Candidate]      # the fitting plans, fastest per token first
    rejected: dict[str, int]     # reason → count: rule violations pruned early, and memory
    evaluated: int               # valid plans estimated
    note: str = ""               # set when the space held more than max_plans plans


def rank_plans(model: ModelSpec, cluster: ClusterSpec, global_batch: int | Sequence[int],
               space: SearchSpace | None = None, options: EstimateOptions | None = None,
               progress: Progress | None = None, max_plans: int = MAX_PLANS) -> Ranking:
    """Estimate every valid plan; keep those that fit, fastest per token first, and count why the others do not.
    Stops after ``max_plans`` plans, in enumeration order, and says so in ``note``."""
    batches = (global_batch,) if isinstance(global_batch, int) else tuple(global_batch)
    planner = Planner(model, cluster, options)
    rejected: dict[str, int] = {}
    fitting: list[Candidate] = []
    evaluated = 0
    cap, peak_tflops = planner.capacity_bytes, cluster.gpu.peak_tflops
    note = ""
    for batch in batches:
        tokens = batch * model.seq_len
        for plan in enumerate_plans(model, cluster, batch, space, rejected):
            if evaluated == max_plans:
                note = (f"the search space holds more than {max_plans:,} plans; the first {max_plans:,} in "
                        f"enumeration order (tp, then pp, dp, micro-batch, ...) were ranked. Narrow the space: "
                        f"fewer global batches, precisions or engines, or micro_batches and max_virtual_stages")
                break
            q = planner.quick(plan)
            evaluated += 1
            if q.peak_high_bytes > cap:
                reason = memory_reason(q.peak_state_bytes, q.peak_activation_bytes, cap)
                rejected[reason] = rejected.get(reason, 0) + 1
                continue
            step_s = q.step_s
            fitting.append(Candidate(plan, step_s, q.peak_bytes, rank_of(plan, q.peak_stage),
                                     F.mfu(q.model_flops_per_step, step_s, peak_tflops, plan.world_size),
                                     tokens / step_s))
            if progress and evaluated % 20000 == 0:
                progress({"phase": "rank", "evaluated": evaluated, "fitting": len(fitting)})
        if note:
            break
    fitting.sort(key=lambda c: (c.step_time_s / (c.plan.global_batch * model.seq_len), c.peak_memory_bytes))
    return Ranking(fitting, rejected, evaluated, note)


def trial_features(model: ModelSpec, cluster: ClusterSpec, options: EstimateOptions | None,
                   plans: Sequence[ParallelPlan]) -> list[StepTerms]:
    """Calibration's features of each plan (``calibrate.step_terms``) under the tuner's options: what trials refit
    on."""
    return plans_step_terms(model, cluster, plans, options or EstimateOptions())


def _check_inputs(model, cluster, global_batch, top_k):
    problems = {}
    for prefix, obj in (("model", model), ("cluster", cluster)):
        for key, messages in obj.problems().items():
            if messages:
                problems[f"{prefix}.{key}" if key else prefix] = messages
    batches = (global_batch,) if isinstance(global_batch, int) else tuple(global_batch)
    if not batches or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in batches):
        problems["global_batch"] = [f"global_batch={global_batch!r} must be a positive integer (or a list of them)"]
    elif len(batches) > MAX_LISTED:
        problems["global_batch"] = [f"give at most {MAX_LISTED} global batches, got {len(batches)}"]
    if not isinstance(top_k, int) or top_k < 1:
        problems["top_k"] = [f"top_k={top_k!r} must be a positive integer"]
    if problems:
        raise SpecError(problems)


def tune(model: ModelSpec, cluster: ClusterSpec, global_batch: int | Sequence[int], space: SearchSpace | None = None,
         options: EstimateOptions | None = None, top_k: int = 10, explain_top: int = 0,
         measure: Callable[[ParallelPlan], float] | None = None, trial_pool: int = 30, max_fraction: float = 1 / 3,
         tolerance: float = 0.05, progress: Progress | None = None) -> TuneResult:
    """Rank every valid plan by estimated step time and, given ``measure``, re-rank the best by short real trials.

    ``measure(plan) -> seconds per step`` runs a short trial (supplied by the launcher). Trials draw from the
    ``trial_pool`` best estimates and measure at most ``max_fraction`` of them (see trials.run_trials).
    """
    _check_inputs(model, cluster, global_batch, top_k)
    options = (options or EstimateOptions()).validate()
    started = time.perf_counter()
    if progress:
        progress({"phase": "enumerate", "message": "enumerating and estimating plans"})
    ranking = rank_plans(model, cluster, global_batch, space, options, progress)
    ranked, evaluated = ranking.ranked, ranking.evaluated
    result = TuneResult(model, cluster, (global_batch,) if isinstance(global_batch, int) else tuple(global_batch),
                        evaluated, len(ranked), ranking.rejected, ranked, pareto_front(ranked), 0.0, top_k,
                        note=ranking.note)
    result.details = [estimate(model, c.plan, cluster, options).to_dict() for c in ranked[:explain_top]]
    if measure is not None and ranked:
        pool = ranked[:trial_pool]
        result.trials = run_trials(pool, measure, max_fraction, tolerance, progress,
                                   features=trial_features(model, cluster, options, [c.plan for c in pool]),
                                   options=options)
    result.elapsed_s = time.perf_counter() - started
    if progress:
        progress({"phase": "done", "evaluated": evaluated, "fitting": len(ranked), "elapsed_s": result.elapsed_s})
    return result
