"""Ingestion's side of the chart tables: new metrics.jsonl records become SeriesStep rows, and exactly the rollup
blocks that hold a step written are folded again (webapp.models.series explains the tables).

A step recorded again (a resumed attempt redoing the steps after its checkpoint) replaces its row, and every block
above it is folded again from its children, of which the ones this batch did not write are read back: only the
blocks at the edges of the batch's steps have such children, so the reads are a few rows per level, not the run.
"""
from __future__ import annotations

import math
import operator
from bisect import bisect_left
from collections.abc import Callable, Iterable
from functools import reduce

from django.db.models import Q

from trainer.contract.records import is_eval_row, is_step_row

from ..models import Run, Series, SeriesBucket, SeriesStep, SourceValLoss
from ..models.series import EVAL_SERIES, TRAIN_SERIES
from .upsert import upsert
from ..models.series_blocks import LEVELS, Block, Point, finer, parents_and_siblings, runs_of, width

MAX_STEP = 2**31 - 1  # steps are stored unsigned, 32 bits
MAX_TOKENS = 2**63 - 1
MAX_RANGES = 32  # more ranges of rows to read back than this (a sparse series) are read as one range

# Where each series' value lies in a step record.
FIGURES: dict[Series, Callable[[dict], object]] = {
    Series.LOSS: lambda r: r.get("loss"),
    Series.LR: lambda r: r.get("lr"),
    Series.GRAD_NORM: lambda r: r.get("grad_norm"),
    Series.TOKENS_PER_S: lambda r: r.get("tokens_per_s"),
    Series.STEP_TIME_S: lambda r: r.get("step_time_s"),
    Series.MFU: lambda r: r.get("mfu"),
    Series.MEMORY: lambda r: r["memory"].get("max_allocated_bytes") if isinstance(r.get("memory"), dict) else None,
}
TRAIN_COLUMNS = ["run_id", "step", "tokens_seen", "wall_time", *(s.label for s in TRAIN_SERIES)]
EVAL_COLUMNS = ["run_id", "step", *(s.label for s in EVAL_SERIES)]
BUCKET_COLUMNS = ["run_id", "series", "level", "bucket", "count", "min_value", "min_step", "min_tokens", "min_wall",
                  "max_value", "max_step", "max_tokens", "max_wall"]
BUCKET_KEYS = ["run_id", "series", "level", "bucket"]


def _number(value) -> float | None:
    """A finite number, or None for anything else (a damaged line may hold a string, a NaN loss is no point)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _whole(value, high: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high else None


class Batch:
    """The new records of one read, one row per step and kind: the last record of a step is the one kept."""

    def __init__(self, records: Iterable[dict]):
        self.train: dict[int, tuple] = {}  # step → (tokens, wall, value of each TRAIN_SERIES)
        self.evals: dict[int, tuple] = {}  # step → (value of each EVAL_SERIES)
        self.sources: dict[tuple[int, str], float] = {}  # (step, source) → a blend source's validation loss
        for record in records:
            step = _whole(record.get("step"), MAX_STEP)
            if step is None:
                continue
            if is_step_row(record):
                self.train[step] = (_whole(record.get("tokens_seen"), MAX_TOKENS), _number(record.get("time")),
                                    *(_number(FIGURES[s](record)) for s in TRAIN_SERIES))
            elif is_eval_row(record):
                self.evals[step] = (_number(record.get("val_loss")),)
                by_source = record.get("val_loss_by_source")
                for name, value in (by_source.items() if isinstance(by_source, dict) else ()):
                    value = _number(value)
                    if isinstance(name, str) and 0 < len(name) <= 64 and value is not None:
                        self.sources[step, name] = value

    def points_count(self) -> int:
        return sum(v is not None for row in self.train.values() for v in row[2:]) + \
            sum(v is not None for row in self.evals.values() for v in row) + len(self.sources)


def series_write(run: Run, records: Iterable[dict]) -> int:
    """Write the chart rows of ``records`` (new lines of metrics.jsonl, in file order) and fold the rollup blocks
    they fall in; returns the number of points (one value of one series at one step) written."""
    batch = Batch(records)
    upsert(SeriesStep, TRAIN_COLUMNS, ["run_id", "step"], [(run.pk, s, *row) for s, row in batch.train.items()])
    upsert(SeriesStep, EVAL_COLUMNS, ["run_id", "step"], [(run.pk, s, *row) for s, row in batch.evals.items()])
    upsert(SourceValLoss, ["run_id", "source", "step", "val_loss"], ["run_id", "source", "step"],
           [(run.pk, source, step, value) for (step, source), value in batch.sources.items()])
    _fold_blocks(run, batch)
    return batch.points_count()


def _fold_blocks(run: Run, batch: Batch) -> None:
    groups = [(TRAIN_SERIES, sorted(batch.train)), (EVAL_SERIES, sorted(batch.evals))]
    groups = [(series, steps) for series, steps in groups if steps]
    # Which blocks change and which of their children to read back depend on the steps only, not on the values:
    # planned for every level first, so that all the reading back is two queries.
    plans = [_plan(steps) for _, steps in groups]
    eval_steps_without_x = [s for s in batch.evals if s not in batch.train]
    step_rows = _step_rows(run, [r for plan in plans for r in plan[LEVELS[0]][1]] + runs_of(eval_steps_without_x))
    stored = _stored_blocks(run, [(series, finer(level), plan[level][1]) for (series, _), plan in zip(groups, plans)
                                  for level in LEVELS[1:]])

    writes, emptied = [], []
    for (series_group, _), plan in zip(groups, plans):
        steps, values, tokens, walls = _level0(series_group, batch, step_rows)
        for series in series_group:
            children = None
            for level in LEVELS:
                parents, ratio = plan[level][0], width(level) // width(finer(level))
                folded = _fold_level0(steps, values[series], tokens, walls, parents, ratio) if children is None \
                    else _fold(children, parents, ratio)
                writes += [(run.pk, series, level, bucket, block.count, *block.low, *block.high)
                           for bucket, block in folded.items() if block is not None]
                gone = [bucket for bucket, block in folded.items() if block is None]  # every point was a NaN
                if gone:
                    emptied.append(Q(series=series, level=level, bucket__in=gone))
                children = {**stored.get((series, level), {}), **folded}
    upsert(SeriesBucket, BUCKET_COLUMNS, BUCKET_KEYS, writes)
    if emptied:
        SeriesBucket.objects.filter(Q(run=run) & _any(emptied)).delete()


def _plan(steps: list[int]) -> dict[int, tuple[list[int], list[tuple[int, int]]]]:
    """For each level: the blocks that hold a changed child, and the ranges of their unchanged children."""
    plan, children, child_level = {}, steps, 0
    for level in LEVELS:
        parents, siblings = parents_and_siblings(children, child_level, level)
        plan[level] = (parents, _fewer(siblings))
        children, child_level = parents, level
    return plan


def _fewer(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(ranges[0][0], ranges[-1][1])] if len(ranges) > MAX_RANGES else ranges


def _any(conditions: list[Q]) -> Q:
    return reduce(operator.or_, conditions)


def _step_rows(run: Run, ranges: list[tuple[int, int]]) -> dict[int, tuple]:
    """Stored step rows in ``ranges``: step → (tokens, wall, value of each Series in order)."""
    if not ranges:
        return {}
    columns = ["step", "tokens_seen", "wall_time", *(s.label for s in Series)]
    rows = SeriesStep.objects.filter(Q(run=run) & _any([Q(step__range=r) for r in _fewer(ranges)]))
    return {row[0]: row[1:] for row in rows.values_list(*columns)}


def _stored_blocks(run: Run, wanted: list[tuple[tuple[Series, ...], int, list[tuple[int, int]]]]) -> dict:
    """Stored blocks of (series, level, ranges) wanted: (series, level) → {bucket: Block}."""
    conditions = [Q(series__in=series, level=level, bucket__range=r) for series, level, ranges in wanted
                  for r in ranges]
    if not conditions:
        return {}
    out: dict[tuple[int, int], dict[int, Block]] = {}
    for row in SeriesBucket.objects.filter(Q(run=run) & _any(conditions)).values_list(*BUCKET_COLUMNS[1:]):
        series, level, bucket, count = row[:4]
        out.setdefault((series, level), {})[bucket] = Block(count, Point(*row[4:8]), Point(*row[8:12]))
    return out


def _level0(group: tuple[Series, ...], batch: Batch, step_rows: dict[int, tuple]) -> tuple[list, dict, list, list]:
    """The group's points around the batch in step order: the stored ones read back, then the batch's over them.
    Returns the steps, each series' values (None: no point at that step), and each step's tokens and wall time."""
    at = {series: 2 + list(Series).index(series) for series in group}
    rows = {step: (row[0], row[1], *(row[at[s]] for s in group)) for step, row in step_rows.items()}
    if group == TRAIN_SERIES:
        rows.update(batch.train)
    else:
        for step, values in batch.evals.items():
            tokens, wall = (batch.train.get(step) or step_rows.get(step) or (None, None))[:2]
            rows[step] = (tokens, wall, *values)
    steps = sorted(rows)
    ordered = [rows[step] for step in steps]
    values = {series: [row[2 + i] for row in ordered] for i, series in enumerate(group)}
    return steps, values, [row[0] for row in ordered], [row[1] for row in ordered]


def _fold_level0(steps: list[int], values: list, tokens: list, walls: list, parents: list[int],
                 ratio: int) -> dict[int, Block | None]:
    """Each parent block folded from the steps it holds: the hot loop of ingestion, so each block is a slice and
    min, max and index on it (done in C); ``index`` finds the first, so the earliest step wins a tie, as in
    Block.merged."""
    folded: dict[int, Block | None] = {}
    lo = 0
    for parent in parents:
        lo = bisect_left(steps, parent * ratio, lo)
        hi = bisect_left(steps, (parent + 1) * ratio, lo)
        block = values[lo:hi]
        where = range(len(block))
        if None in block:  # a NaN in the record: that step has no point
            where = [k for k, v in enumerate(block) if v is not None]
            block = [block[k] for k in where]
        if not block:
            folded[parent] = None
            continue
        low, high = lo + where[block.index(min(block))], lo + where[block.index(max(block))]
        folded[parent] = Block(len(block), Point(values[low], steps[low], tokens[low], walls[low]),
                               Point(values[high], steps[high], tokens[high], walls[high]))
    return folded


def _fold(children: dict[int, Block | None], parents: list[int], ratio: int) -> dict[int, Block | None]:
    """Each parent block folded from its children (None: it holds no point any more)."""
    folded: dict[int, Block | None] = dict.fromkeys(parents)
    for child, block in children.items():
        parent = child // ratio
        if block is not None and parent in folded:
            folded[parent] = block.merged(folded[parent])
    return folded
