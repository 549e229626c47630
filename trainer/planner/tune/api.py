"""JSON in, JSON out: what POST /api/tune/ wraps.

    tune_json({"model": "gpt3-175b" | {...}, "cluster": {...}, "global_batch": 1536 | [512, 1024],
               "space": {SearchSpace fields}, "options": {...}, "top_k": 10, "explain_top": 1,
               "trial_pool": 30, "max_fraction": 0.333, "tolerance": 0.05},
              measure=None, progress=None)
      -> TuneResult.to_dict(explain=True)

``parse_tune_request(payload) -> TuneRequest`` checks a request without estimating any plan: what a caller that
queues the tune for later (a tuning job) refuses at once. ``measure(plan) -> seconds per step`` and
``progress(event: dict)`` are callables the caller supplies (the launcher's short trials; the web page's progress
bar), not JSON. Bad input raises SpecError whose ``errors`` map dotted field paths to messages, every problem at once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from trainer.planner.estimate.api import cluster_from_json, model_from_json, options_from_json
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError
from trainer.planner.tune.search import TuneResult, tune
from trainer.planner.tune.space import SearchSpace

_REQUIRED = ("model", "cluster", "global_batch")


@dataclass(frozen=True)
class TuneRequest:
    """A checked tune request: the specs, the search space, and the knobs of ranking and trials."""

    model: ModelSpec
    cluster: ClusterSpec
    global_batches: tuple[int, ...]         # one tune searches every batch at once
    space: SearchSpace = field(default_factory=SearchSpace)
    options: EstimateOptions = field(default_factory=EstimateOptions)
    top_k: int = 10                         # ranked plans in the answer
    explain_top: int = 1                    # of those, how many carry the whole explained estimate
    trial_pool: int = 30                    # trials draw from this many best estimates …
    max_fraction: float = 1 / 3             # … and measure at most this fraction of them
    tolerance: float = 0.05                 # trials stop once no unmeasured plan can beat the best by more

    def run(self, measure: Callable[[ParallelPlan], float] | None = None,
            progress: Callable[[dict], None] | None = None) -> TuneResult:
        return tune(self.model, self.cluster, self.global_batches, self.space, self.options, top_k=self.top_k,
                    explain_top=self.explain_top, measure=measure, trial_pool=self.trial_pool,
                    max_fraction=self.max_fraction, tolerance=self.tolerance, progress=progress)


_KNOBS = {f.name: f.default for f in dataclasses.fields(TuneRequest)
          if f.name in ("top_k", "explain_top", "trial_pool", "max_fraction", "tolerance")}
_KEYS = {*_REQUIRED, "space", "options", *_KNOBS}


def _positive_ints(value: Any) -> tuple[int, ...] | None:
    values = value if isinstance(value, list) else [value]
    if values and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        return tuple(values)
    return None


def _knob_problem(name: str, value: Any) -> str:
    """What is wrong with a numeric knob, or ''."""
    integer = isinstance(value, int) and not isinstance(value, bool)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name in ("top_k", "trial_pool") and not (integer and value >= 1):
        return f"{name}={value!r} must be a positive integer"
    if name == "explain_top" and not (integer and value >= 0):
        return f"explain_top={value!r} must be a non-negative integer"
    if name == "max_fraction" and not (number and 0 < value <= 1):
        return f"max_fraction={value!r} must be in (0, 1]"
    if name == "tolerance" and not (number and value >= 0):
        return f"tolerance={value!r} must not be negative"
    return ""


def _space(value: Any) -> SearchSpace:
    names = sorted(f.name for f in dataclasses.fields(SearchSpace))
    if value is None:
        return SearchSpace()
    if not isinstance(value, dict) or set(value) - set(names):
        raise SpecError.single("space", f"space must be an object with fields among {names}")
    try:
        return SearchSpace.from_dict(value)
    except SpecError as exc:
        raise exc.prefixed("space") from None


def parse_tune_request(payload: Any) -> TuneRequest:
    """Check a tune request field by field and build its ``TuneRequest``; no plan is enumerated or estimated."""
    if not isinstance(payload, dict):
        raise SpecError.single("", "the request must be a JSON object")
    unknown = sorted(set(payload) - _KEYS)
    if unknown:
        raise SpecError.single("", f"unknown field(s) {unknown}")
    errors: dict[str, list[str]] = {key: [f"{key} is required"] for key in _REQUIRED if key not in payload}
    parsed: dict[str, Any] = {}
    for key, parse in (("model", model_from_json), ("cluster", cluster_from_json), ("space", _space),
                       ("options", options_from_json)):
        if key in payload or key in ("space", "options"):
            try:
                parsed[key] = parse(payload.get(key))
            except SpecError as exc:
                for path, messages in exc.errors.items():
                    errors.setdefault(path, []).extend(messages)
    if "global_batch" in payload:
        parsed["global_batches"] = _positive_ints(payload["global_batch"])
        if parsed["global_batches"] is None:
            errors["global_batch"] = [f"global_batch={payload['global_batch']!r} must be a positive integer "
                                      f"(or a list of them)"]
    for name, default in _KNOBS.items():
        parsed[name] = payload.get(name, default)
        problem = _knob_problem(name, parsed[name])
        if problem:
            errors[name] = [problem]
    if errors:
        raise SpecError(errors)
    return TuneRequest(**parsed)


def tune_json(payload: dict, measure: Callable[[ParallelPlan], float] | None = None,
              progress: Callable[[dict], None] | None = None) -> dict[str, Any]:
    return parse_tune_request(payload).run(measure, progress).to_dict(explain=True)
