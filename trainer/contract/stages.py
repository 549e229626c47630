"""Which layers each pipeline stage holds. Standard library only.

A pipeline cuts the model into pp·v stages in model order (v model chunks per pipeline rank under the multi-chunk
schedules), each a run of consecutive layers. By default the layers are shared equally. A plan may instead give every
stage's count (``stage_layers``), or, in Megatron-LM's form, the first and the last stage's counts with the rest
spread evenly over the stages between (``first_stage_layers``, ``last_stage_layers``): Llama 3 405B's 126 layers on
pp=16 are 7, fourteen stages of 8, and 7, which lighten the stages that also hold the embedding and the head.
"""
from __future__ import annotations

from typing import Any, Optional

Plan = Any  # a specs.ParallelPlan


def stage_count(plan: Plan) -> int:
    """Stages in model order: pp ranks × the chunks each holds."""
    return plan.pp * plan.model_chunks


def stage_layer_counts(n_layers: int, plan: Plan) -> Optional[tuple[int, ...]]:
    """The layers of each stage, in model order, or None when the plan's layout does not fit ``n_layers`` (the
    reason is ``layout_problem``)."""
    return _counts(n_layers, plan)[0]


def layout_problem(n_layers: int, plan: Plan) -> str:
    """Why the plan's stages do not cut ``n_layers`` layers ('' when they do)."""
    return _counts(n_layers, plan)[1]


def stage_layer_ranges(n_layers: int, plan: Plan) -> tuple[range, ...]:
    """The layer indices of each stage, in model order (the plan must fit: see ``layout_problem``)."""
    counts = stage_layer_counts(n_layers, plan)
    if counts is None:
        raise ValueError(layout_problem(n_layers, plan))
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return tuple(range(s, s + c) for s, c in zip(starts, counts))


def is_uneven(plan: Plan) -> bool:
    return bool(plan.stage_layers or plan.first_stage_layers or plan.last_stage_layers)


def _counts(n_layers: int, plan: Plan) -> tuple[Optional[tuple[int, ...]], str]:
    stages = stage_count(plan)
    if plan.stage_layers:
        counts = tuple(plan.stage_layers)
        if len(counts) != stages:
            return None, (f"stage_layers gives {len(counts)} stage(s) but the plan has pp×chunks={plan.pp}×"
                          f"{plan.model_chunks}={stages}")
        if min(counts) < 1:
            return None, f"stage_layers={list(counts)}: every stage needs at least one layer"
        if sum(counts) != n_layers:
            return None, f"stage_layers={list(counts)} adds up to {sum(counts)} layers but the model has {n_layers}"
        return counts, ""
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if first or last:
        middle = stages - (first > 0) - (last > 0)
        rest = n_layers - first - last
        if middle < 0 or (middle == 0 and rest) or rest < 0:
            return None, (f"first_stage_layers={first} and last_stage_layers={last} do not leave n_layers="
                          f"{n_layers} layers for the other {max(middle, 0)} stage(s)")
        if middle and (rest < middle or rest % middle):
            return None, (f"after first_stage_layers={first} and last_stage_layers={last}, {rest} layers do not "
                          f"spread evenly over the {middle} other stage(s)")
        each = rest // middle if middle else 0
        counts = ((first,) if first else ()) + (each,) * middle + ((last,) if last else ())
        return counts, ""
    if n_layers % stages:
        what = (f"pp×virtual_stages={plan.pp}×{plan.model_chunks}={stages}" if plan.model_chunks > 1
                else f"pp={plan.pp}")
        return None, (f"{what} does not divide n_layers={n_layers}; give each stage's layers with stage_layers, or "
                      f"the first and last stage's with first_stage_layers / last_stage_layers")
    return (n_layers // stages,) * stages, ""
