"""Runs side by side: their series on one x axis, binned over one range so that every run's bins share their edges
and the curves overlay, and the fields of their plans and models that differ (what a reader wants to know first:
what changed between these runs)."""
from __future__ import annotations

from ..models import Run
from .series import Axis, Frame, series_in_frame

MISSING = None  # a field one run's spec has and another's lacks


def runs_compare(runs: list[Run], names: list[str], unit: str, start: float | None, end: float | None,
                 points: int) -> dict:
    axes = [Axis.of(run, unit) for run in runs]
    extents = [e for e in (axis.extent() for axis in axes) if e is not None]
    low = start if start is not None else min((e[0] for e in extents), default=0.0)
    high = end if end is not None else max((e[1] for e in extents), default=0.0)
    frame = Frame(low, high, points)
    return {"x": unit, "frame": frame.describe(),
            "runs": [{"id": run.pk, "name": run.name, **series_in_frame(run, names, axis, frame)}
                     for run, axis in zip(runs, axes)],
            "differences": spec_differences(runs)}


def _flat(value, prefix: str) -> dict:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}"))
        return out
    return {prefix: value}


def _parts(run: Run) -> dict:
    """The plan and the model a run launched with (its stored spec; the plan's and model's own for a run that
    predates stored specs)."""
    spec = run.spec or {}
    return {**_flat(spec.get("plan", run.plan.spec), "plan"), **_flat(spec.get("model", run.model_config.spec),
                                                                        "model")}


def spec_differences(runs: list[Run]) -> list[dict]:
    """Each plan or model field whose value is not the same in every run, with each run's value in run order."""
    parts = [_parts(run) for run in runs]
    fields = sorted({field for part in parts for field in part})
    out = []
    for field in fields:
        values = [part.get(field, MISSING) for part in parts]
        if any(v != values[0] for v in values[1:]):
            out.append({"field": field, "values": values})
    return out
