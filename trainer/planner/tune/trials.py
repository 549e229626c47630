"""Short real trials of the best-estimated plans, and when to stop measuring.

Strategy (measure-and-recalibrate, then a stopping bound):
1. Measure the plan with the lowest current prediction. At first the prediction is the planner's estimate; the
   second and third trials go to the better half's plans whose communication share differs most from those measured.
2. Once three plans are measured, refit the time model on them — calibration's features and fit
   (``calibrate.step_terms``, ``calibrate.fit_time``) with its compute and communication coefficients free
   (``calibrate.TRIAL_TERMS``), every other term at the tuner's options — and re-predict every unmeasured plan. A
   plan the planner flattered (say, communication-heavy on a slower network than assumed) drops down the order; one
   it underrated moves up. Without features (``features`` None) predictions are the estimates scaled by the median
   measured/estimated ratio.
3. Bound: δ = the largest leave-one-out relative error of the refit on the measured plans (or the spread of their
   ratios before the refit; never below ``error_bound``). No unmeasured plan j can run faster than
   prediction_j·(1 − δ). When even the lowest of those is ≥ best_measured / (1 + tolerance), no unmeasured plan
   can beat the best measured by more than the tolerance, and the trials stop.
   The bound is only trusted after half the budget (and at least ``min_trials``) has been measured.
4. They also stop at the budget, ⌊max_fraction · pool⌋ trials. The pick is the best measured plan.

A trial that fails (``measure`` raises) is recorded with its reason and the trials go on with the next plan. It
counts against the budget, as a trial that ran: it spent the time it took (a timed-out trial, the most of any), and a
budget of attempts keeps a machine on which every trial fails from running through the whole pool. It adds no point
to the refit or the bound, cannot be the pick, and is not tried again. When every trial fails there is no pick: the
result's ``best`` is None and its note lists the reasons; the caller keeps the estimates' ranking.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from trainer.planner.estimate.calibrate import TRIAL_TERMS, StepTerms, fit_time
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ParallelPlan, SpecError


# A handful of residuals understates how far the noise of unmeasured plans can reach: the bound widens them.
SAFETY = 2.0


@dataclass
class TrialResult:
    pool: int
    budget: int
    measured: list = field(default_factory=list)   # Candidates with measured_step_time_s, in measuring order
    failed: list = field(default_factory=list)     # FailedTrials, in trying order
    best: Any = None                                 # None when no trial gave a step time
    stopped: str = ""                                # "bound", "budget" or "pool"
    error_bound: float = 0.0                         # δ when the trials stopped
    note: str = ""

    @property
    def tried(self) -> int:
        return len(self.measured) + len(self.failed)

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "budget": self.budget, "tried": self.tried,
                "measured": [c.to_dict() for c in self.measured], "failed": [f.to_dict() for f in self.failed],
                "best": self.best.to_dict() if self.best else None, "stopped": self.stopped,
                "error_bound": self.error_bound, "note": self.note}


@dataclass(frozen=True)
class FailedTrial:
    candidate: Any     # the Candidate as estimated; it has no measured time
    reason: str        # one line

    def to_dict(self) -> dict[str, Any]:
        return {**self.candidate.to_dict(), "failed": self.reason}


REASON_CHARS = 500


def failure_reason(exc: BaseException) -> str:
    """The first line of an exception's message (TrialError puts the log's tail below it), or its type's name."""
    lines = str(exc).strip().splitlines()
    reason = lines[0].strip() if lines else ""
    reason = reason or type(exc).__name__
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + "…"


def run_trials(pool: Sequence, measure: Callable[[ParallelPlan], float], max_fraction: float = 1 / 3,
               tolerance: float = 0.05, progress: Callable[[dict], None] | None = None, error_bound: float = 0.0,
               min_trials: int = 3, features: Sequence[StepTerms] | None = None,
               options: EstimateOptions | None = None) -> TrialResult:
    """Measure plans of ``pool`` (Candidates) until the bound or the budget says stop; see the module docstring.

    ``features``: calibration's features of each pool entry, same order, read under ``options`` (the tuner's;
    ``search.trial_features``). A ``measure`` that raises fails that trial only (it is in ``result.failed`` with
    its reason, and ``progress`` hears a "trial" event with ``failed``); when every trial fails, ``result.best`` is
    None and ``result.note`` says "all N trials failed: …". A ``measure`` that returns something other than a
    positive finite number is a broken measure, not a failed trial: that raises ValueError.
    """
    if not 0 < max_fraction <= 1:
        raise SpecError.single("max_fraction", f"max_fraction={max_fraction} must be in (0, 1]")
    if tolerance < 0 or error_bound < 0:
        raise SpecError.single("tolerance", "tolerance and error_bound must not be negative")
    if features is not None and len(features) != len(pool):
        raise SpecError.single("features", f"{len(features)} feature pairs for a pool of {len(pool)} plans")
    pool = list(pool)
    n = len(pool)
    budget = max(1, math.floor(n * max_fraction))
    # a bound fitted on very few residuals is overconfident: trust it only after half the budget
    settle = max(min_trials, math.ceil(budget / 2))
    result = TrialResult(pool=n, budget=budget)
    result.error_bound = error_bound
    predicted = [c.step_time_s for c in pool]
    done: dict[int, float] = {}     # pool index → measured seconds
    failed: set[int] = set()
    while True:
        if len(done) + len(failed) == n:
            result.stopped = "pool"
            break
        if len(done) + len(failed) >= budget:
            result.stopped = "budget"
            break
        # exploring costs trials that could go to the best predictions: only worth it with room for both
        i = _next(predicted, done, failed, features, len(done) < min_trials and budget >= 2 * min_trials)
        try:
            seconds = float(measure(pool[i].plan))
        # Exception, not BaseException: whatever one plan's training raises (TrialError, OSError, MemoryError, …)
        # is that plan's failure, while KeyboardInterrupt and SystemExit mean this process is being stopped and
        # must stop the trials too.
        except Exception as exc:
            failed.add(i)
            result.failed.append(FailedTrial(pool[i], failure_reason(exc)))
            _report(progress, result, pool[i], failed=result.failed[-1].reason)
            continue
        if not seconds > 0 or math.isinf(seconds):
            raise ValueError(f"measure() returned {seconds!r} for a plan; expected a positive step time in seconds")
        done[i] = seconds
        measured = replace(pool[i], measured_step_time_s=seconds)
        result.measured.append(measured)
        if result.best is None or seconds < result.best.measured_step_time_s:
            result.best = measured
        predictions = _recalibrate(pool, features, done, min_trials, options or EstimateOptions())
        predicted = predictions.step_s
        result.error_bound = max(predictions.error_bound, error_bound)
        _report(progress, result, pool[i], measured_step_time_s=seconds)
        # a plan whose trial failed cannot run here: it is no contender the bound must rule out
        rest = [j for j in range(n) if j not in done and j not in failed]
        if rest and len(done) >= min(settle, budget):
            floor = min(predicted[j] for j in rest) * (1 - result.error_bound)
            if floor >= result.best.measured_step_time_s / (1 + tolerance):
                result.stopped = "bound"
                break
    result.note = _note(result, tolerance)
    return result


def _report(progress, result: TrialResult, candidate, **outcome) -> None:
    """One "trial" event: how many trials so far, and this one's outcome (measured_step_time_s or failed)."""
    if progress:
        progress({"phase": "trial", "done": result.tried, "budget": result.budget, "pool": result.pool,
                  **outcome, "estimated_step_time_s": candidate.step_time_s,
                  "best_measured_s": result.best.measured_step_time_s if result.best else None,
                  "error_bound": result.error_bound, "failed_count": len(result.failed)})


def _note(result: TrialResult, tolerance: float) -> str:
    reasons = "; ".join(f.reason for f in result.failed)
    if result.best is None:
        return (f"all {result.tried} trials failed: {reasons}; no plan was measured, the ranking is the "
                f"estimates'")
    note = f"measured {len(result.measured)} of {result.pool} plans (budget {result.budget}"
    note += f", {len(result.failed)} more failed)" if result.failed else ")"
    note += f"; stopped by {result.stopped}"
    if result.stopped == "bound":
        note += (f": no unmeasured plan can beat the best measured by more than {tolerance:.0%} "
                 f"(prediction error bound {result.error_bound:.3f})")
    else:
        note += "; the pick is the best measured plan"
    if result.failed:
        note += f"; failed: {reasons}"
    return note


def _next(predicted: list[float], done: dict, failed: set, features, exploring: bool) -> int:
    """The untried plan with the lowest prediction — except while exploring: then the first plans measured are
    the best-predicted one and, among the better half, the most and the least communication-bound, so that the
    refit can tell compute from communication."""
    rest = [j for j in range(len(predicted)) if j not in done and j not in failed]
    best = min(rest, key=lambda j: predicted[j])
    if not exploring or features is None or not done:
        return best
    half = sorted(rest, key=lambda j: predicted[j])[:max(1, len(predicted) // 2)]
    share = {j: features[j].communication_share for j in half}
    measured_shares = [features[j].communication_share for j in done]
    # the candidate whose communication share is farthest from every measured one
    return max(half, key=lambda j: (min(abs(share[j] - m) for m in measured_shares), -predicted[j]))


@dataclass(frozen=True)
class Predictions:
    step_s: list[float]       # for every pool entry, same order
    error_bound: float        # δ: how far off a prediction may be, relatively


def _recalibrate(pool, features, done: dict[int, float], min_trials: int, options: EstimateOptions) -> Predictions:
    """Predictions for every pool entry from the measured ones, and the error bound δ of those predictions."""
    idx = list(done)
    if features is not None and len(idx) >= min_trials:
        points, times = [features[i] for i in idx], [done[i] for i in idx]
        x = fit_time(points, times, TRIAL_TERMS, options)
        errors = []
        for k in range(len(idx)):  # leave-one-out: how wrong the refit is on a plan it did not see
            xk = fit_time(points[:k] + points[k + 1:], times[:k] + times[k + 1:], TRIAL_TERMS, options)
            errors.append(abs(xk.predict(points[k]) - times[k]) / times[k])
        return Predictions([x.predict(f) for f in features], SAFETY * max(errors))
    ratios = sorted(done[i] / pool[i].step_time_s for i in idx)
    median = ratios[len(ratios) // 2]
    spread = (ratios[-1] - ratios[0]) / ratios[-1]
    return Predictions([c.step_time_s * median for c in pool], SAFETY * spread)
