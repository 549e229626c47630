"""JSON in, JSON out: what POST /api/tune/ wraps.

    tune_json({"model": "gpt3-175b" | {...}, "cluster": {...}, "global_batch": 1536 | [512, 1024],
               "space": {SearchSpace fields}, "options": {...}, "top_k": 10, "explain_top": 1,
               "trial_pool": 30, "max_fraction": 0.333, "tolerance": 0.05},
              measure=None, progress=None)
      -> TuneResult.to_dict(explain=True)

``measure(plan) -> seconds per step`` and ``progress(event: dict)`` are callables the caller supplies (the
launcher's short trials; the web page's progress bar), not JSON.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from trainer.planner.estimate.api import cluster_from_json, model_from_json, options_from_json
from trainer.contract import ParallelPlan, SpecError
from trainer.planner.tune.search import tune
from trainer.planner.tune.space import SearchSpace

_KEYS = {"model", "cluster", "global_batch", "space", "options", "top_k", "explain_top", "trial_pool",
         "max_fraction", "tolerance"}


def tune_json(payload: dict, measure: Callable[[ParallelPlan], float] | None = None,
              progress: Callable[[dict], None] | None = None) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise SpecError.single("", "the request must be a JSON object")
    unknown = sorted(set(payload) - _KEYS)
    if unknown:
        raise SpecError.single("", f"unknown field(s) {unknown}")
    for key in ("model", "cluster", "global_batch"):
        if key not in payload:
            raise SpecError.single(key, f"{key} is required")
    space_fields = {f.name for f in dataclasses.fields(SearchSpace)}
    space = payload.get("space") or {}
    if not isinstance(space, dict) or set(space) - space_fields:
        raise SpecError.single("space", f"space must be an object with fields among {sorted(space_fields)}")
    batch = payload["global_batch"]
    result = tune(model_from_json(payload["model"]), cluster_from_json(payload["cluster"]),
                  batch if isinstance(batch, int) else list(batch) if isinstance(batch, list) else batch,
                  SearchSpace.from_dict(space), options_from_json(payload.get("options")),
                  top_k=payload.get("top_k", 10), explain_top=payload.get("explain_top", 1), measure=measure,
                  trial_pool=payload.get("trial_pool", 30), max_fraction=payload.get("max_fraction", 1 / 3),
                  tolerance=payload.get("tolerance", 0.05), progress=progress)
    return result.to_dict(explain=True)
