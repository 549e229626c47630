"""JSON in, JSON out: what POST /api/planner/advice/ wraps.

    advice_json({"model": "gpt2-small" | {ModelSpec fields}, "cluster": {ClusterSpec fields} | {"gpu": …, "nodes": …},
                 "plan": {ParallelPlan fields} | null, "options": {EstimateOptions fields} | null,
                 "global_batch": 64 | null})
      -> Advice.to_dict()

Bad input raises SpecError whose ``errors`` map dotted field paths to messages.
"""
from __future__ import annotations

from typing import Any

from trainer.contract import ParallelPlan, SpecError
from trainer.planner.advice.advise import advise
from trainer.planner.estimate.api import cluster_from_json, model_from_json, options_from_json

FIELDS = ("model", "cluster", "plan", "options", "global_batch")


def plan_from_json(value: Any) -> ParallelPlan | None:
    if value is None:
        return None
    try:
        return ParallelPlan.from_dict(value)
    except SpecError as exc:
        raise exc.prefixed("plan") from None


def advice_json(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise SpecError.single("", "the request must be a JSON object")
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        raise SpecError.single("", f"unknown field(s) {unknown}; expected {list(FIELDS)}")
    for key in ("model", "cluster"):
        if key not in payload:
            raise SpecError.single(key, f"{key} is required")
    model = model_from_json(payload["model"])
    cluster = cluster_from_json(payload["cluster"])
    plan = plan_from_json(payload.get("plan"))
    options = options_from_json(payload.get("options"))
    return advise(model, cluster, plan, options, payload.get("global_batch")).to_dict()
