"""JSON in, JSON out: what POST /api/estimate/ wraps.

    estimate_json({"model": "gpt3-175b" | {ModelSpec fields}, "plan": {ParallelPlan fields},
                   "cluster": {ClusterSpec fields} | {"gpu": "A100-SXM-80GB", "nodes": 128, ...},
                   "options": {EstimateOptions fields}, "token_budget": 3e11,
                   "inference": {"tp": 8, "batch": 8, "context": 2048, "precision": "bf16"}})
      -> Estimate.to_dict() (+ "inference": InferenceEstimate.to_dict() when asked)

Bad input raises SpecError (a ValueError) whose ``errors`` map dotted field paths to messages.
"""
from __future__ import annotations

from typing import Any

from trainer.planner.estimate.explain import estimate
from trainer.planner.estimate.inference import inference_estimate
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract.presets import MODELS
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError

def model_from_json(value: Any) -> ModelSpec:
    if isinstance(value, str):
        if value not in MODELS:
            raise SpecError.single("model", f"unknown model preset {value!r}; presets: {', '.join(MODELS)}")
        return MODELS[value]
    if not isinstance(value, dict):
        raise SpecError.single("model", "model must be a preset name or an object of ModelSpec fields")
    try:
        return ModelSpec.from_dict(value)
    except SpecError as exc:
        raise exc.prefixed("model") from None


def cluster_from_json(value: Any) -> ClusterSpec:
    """A ClusterSpec object; its GPU may be a preset name (``ClusterSpec.expand_json``)."""
    if not isinstance(value, dict):
        raise SpecError.single("cluster", "cluster must be an object")
    try:
        return ClusterSpec.from_dict(value)
    except SpecError as exc:
        raise exc.prefixed("cluster") from None


def options_from_json(value: Any) -> EstimateOptions:
    if value is not None and not isinstance(value, dict):
        raise SpecError.single("options", "options must be an object")
    try:
        return EstimateOptions.from_dict(value)
    except TypeError as exc:
        raise SpecError.single("options", str(exc)) from None


def estimate_json(payload: dict) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise SpecError.single("", "the request must be a JSON object")
    unknown = sorted(set(payload) - {"model", "plan", "cluster", "options", "token_budget", "inference"})
    if unknown:
        raise SpecError.single("", f"unknown field(s) {unknown}")
    for key in ("model", "plan", "cluster"):
        if key not in payload:
            raise SpecError.single(key, f"{key} is required")
    model = model_from_json(payload["model"])
    try:
        plan = ParallelPlan.from_dict(payload["plan"])
    except SpecError as exc:
        raise exc.prefixed("plan") from None
    clu = cluster_from_json(payload["cluster"])
    options = options_from_json(payload.get("options"))
    out = estimate(model, plan, clu, options, payload.get("token_budget")).to_dict()
    if payload.get("inference") is not None:
        inf = payload["inference"]
        if not isinstance(inf, dict):
            raise SpecError.single("inference", "inference must be an object")
        try:
            out["inference"] = inference_estimate(model, clu, **inf).to_dict()
        except TypeError as exc:
            raise SpecError.single("inference", str(exc)) from None
    return out
