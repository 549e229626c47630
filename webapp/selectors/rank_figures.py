"""One run across its ranks: each rank's step time, throughput and peak memory over the latest steps, folded into
the spread between ranks and the rank that holds the others back.

The trainer gathers every rank's figures of a step into the step's record (``ranks``, trainer.contract.records);
a world of one has only its own, which are the record's. Each rank's figure is its median over the steps read (a
single slow step, a checkpoint's or an evaluation's, moves no rank), then min, median and max are over the ranks.
"""
from __future__ import annotations

import statistics

from trainer.contract.records import RANK_FIGURES

from ..models import Metric, Run

# Which end of a figure is the bad one: the longest step, the lowest throughput, the most memory, the longest own
# work (compute_s: what tells the rank that holds the others back, whose step times are all alike).
WORST = {"step_time_s": max, "tokens_per_s": min, "max_allocated_bytes": max, "compute_s": max}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _figures(record: dict) -> dict[str, list[float | None]] | None:
    """A step record's figures by rank (None where a rank has none: a CPU reports no memory), or None for a
    record without usable ones."""
    ranks = record.get("ranks")
    if not ranks:
        memory = record.get("memory")
        ranks = {"step_time_s": [record.get("step_time_s")], "tokens_per_s": [record.get("tokens_per_s")],
                 "max_allocated_bytes": [memory.get("max_allocated_bytes") if isinstance(memory, dict) else None]}
    if not isinstance(ranks, dict):
        return None
    out = {}
    for name in RANK_FIGURES:
        values = ranks.get(name)
        if values is None:  # a figure the trainer did not gather when it wrote the record: none for any rank
            values = [None] * len(ranks.get("step_time_s") or [None])
        if not isinstance(values, list) or not values or not all(v is None or _number(v) for v in values):
            return None
        out[name] = [None if v is None else float(v) for v in values]
    return out if len({len(v) for v in out.values()}) == 1 else None


def _fold(per_rank: list[float | None], worst) -> dict | None:
    known = [rank for rank, value in enumerate(per_rank) if value is not None]
    if not known:
        return None
    values = [per_rank[rank] for rank in known]
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "worst_rank": worst(known, key=per_rank.__getitem__), "per_rank": per_rank}


def rank_summary(run: Run, steps: int = 100) -> dict:
    """The latest ``steps`` training steps of ``run`` folded by rank; a figure no rank reports is left out."""
    rows = Metric.objects.filter(run=run, kind="train").order_by("-step").values_list("step", "values")[:steps]
    read = [(step, figures) for step, values in rows
            if isinstance(values, dict) and (figures := _figures(values)) is not None]
    if not read:
        return {"steps": None, "world_size": None, "slowest_rank": None, "figures": {}}
    world = len(read[0][1]["step_time_s"])  # the newest step's world; an older one of another size is left out
    read = [(step, figures) for step, figures in read if len(figures["step_time_s"]) == world]
    folded = {}
    for name in RANK_FIGURES:
        per_rank = []
        for rank in range(world):
            values = [figures[name][rank] for _, figures in read if figures[name][rank] is not None]
            per_rank.append(statistics.median(values) if values else None)
        figure = _fold(per_rank, WORST[name])
        if figure is not None:
            folded[name] = figure
    steps_read = [step for step, _ in read]
    slowest = next((folded[name]["worst_rank"] for name in ("compute_s", "step_time_s") if name in folded), None)
    return {"steps": {"first": min(steps_read), "last": max(steps_read), "count": len(steps_read)},
            "world_size": world, "slowest_rank": slowest, "figures": folded}
