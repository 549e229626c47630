"""Charts' side of the series tables: a step range read from the level whose blocks fit the points asked for, then
binned on the x axis with each bin's lowest and highest point kept (min/max downsampling).

Min/max per bin, not an average or LTTB: the rollups already hold each block's extremes, so the bins are a fold
of at most a few thousand rows, and a loss spike before a divergence or a memory peak is never smoothed away.
Every point served is a point the run recorded (docs/live-data.md has the method and its sources).

The bins are equal slices of the x range ``[start, end]``, so two runs binned over the same range share every bin
edge and their curves overlay point for point (webapp.selectors.compare).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import reduce

from django.db.models import Max, Min, Q

from ..models import Evaluation, Run, SeriesBucket, SeriesStep, SourceValLoss
from ..models.evaluations import EVAL_SERIES_PREFIX, headline_of
from ..models.series import SERIES_BY_NAME, SOURCE_SERIES_PREFIX
from ..models.series_blocks import cover, level_for, width

X_UNITS = ("step", "tokens", "time")
MAX_STEP = 2**31 - 1
MAX_TOKENS = 2**63 - 1


@dataclass(frozen=True)
class Axis:
    """One run's x axis in ``unit``: step, tokens seen, or seconds since the run's first step began."""

    run_id: int
    unit: str
    origin: float = 0.0  # for time: the wall time the first step began

    @classmethod
    def of(cls, run: Run, unit: str) -> "Axis":
        if unit != "time":
            return cls(run.pk, unit)
        first = (SeriesStep.objects.filter(run=run, wall_time__isnull=False).order_by("step")
                 .values_list("wall_time", "step_time_s").first())
        return cls(run.pk, unit, first[0] - (first[1] or 0.0) if first else 0.0)

    def extent(self) -> tuple[float, float] | None:
        """The lowest and highest x the run has."""
        column = {"step": "step", "tokens": "tokens_seen", "time": "wall_time"}[self.unit]
        low, high = SeriesStep.objects.filter(run_id=self.run_id).aggregate(low=Min(column),
                                                                            high=Max(column)).values()
        if low is None:
            return None
        shift = self.origin if self.unit == "time" else 0
        return low - shift, high - shift

    def steps(self, start: float, end: float) -> tuple[int, int] | None:
        """The first and last step whose x lies in ``[start, end]`` (x grows with the step)."""
        if self.unit == "step":
            first, last = max(math.ceil(start), 0), min(math.floor(end), MAX_STEP)
            return (first, last) if first <= last else None
        if self.unit == "tokens":  # whole numbers a 64-bit column can be compared with
            column, low, high = "tokens_seen", max(math.ceil(start), 0), min(math.floor(end), MAX_TOKENS)
        else:
            column, low, high = "wall_time", start + self.origin, end + self.origin
        rows = SeriesStep.objects.filter(run_id=self.run_id)
        first = rows.filter(**{f"{column}__gte": low}).order_by(column).values_list("step", flat=True).first()
        last = rows.filter(**{f"{column}__lte": high}).order_by(f"-{column}").values_list("step", flat=True).first()
        return (first, last) if first is not None and last is not None and first <= last else None


@dataclass
class Frame:
    """What a chart asks: an x range and at most ``points`` points a series, as ``points // 2`` equal bins."""

    start: float
    end: float
    points: int

    @property
    def bins(self) -> int:
        return max(self.points // 2, 1)

    @property
    def bin_width(self) -> float:
        return (self.end - self.start) / self.bins if self.end > self.start else 1.0

    def describe(self) -> dict:
        return {"start": self.start, "end": self.end, "bins": self.bins, "bin_width": self.bin_width}


def series_read(run: Run, names: list[str], unit: str, start: float | None = None, end: float | None = None,
                points: int = 2000) -> dict:
    """Each series of ``names`` over ``[start, end]`` (the whole run where not given) in ``unit``, downsampled to
    at most ``points`` points."""
    axis = Axis.of(run, unit)
    extent = axis.extent()
    if extent is None:
        return _answer(unit, None, 0, {name: _empty() for name in names})
    frame = Frame(extent[0] if start is None else start, extent[1] if end is None else end, points)
    return series_in_frame(run, names, axis, frame)


def series_in_frame(run: Run, names: list[str], axis: Axis, frame: Frame) -> dict:
    steps = axis.steps(frame.start, frame.end) if frame.start <= frame.end else None
    if steps is None:
        return _answer(axis.unit, frame, 0, {name: _empty() for name in names})
    first, last = steps
    # At most `points` blocks a series (between half a bin and two bins wide, as the levels step by 4; each gives
    # its two extremes), or 4 × `points` step rows (a row holds every series): a query reads a few thousand rows
    # a series whatever the range.
    level = level_for(first, last, max_blocks=frame.points, max_steps=4 * frame.points)
    charted = [name for name in names if not name.startswith((SOURCE_SERIES_PREFIX, EVAL_SERIES_PREFIX))]
    candidates = _read(run, charted, axis.unit, cover(first, last, level))
    origin = axis.origin if axis.unit == "time" else 0
    served = {name: _downsample(*candidates[name], frame, origin, raw=level == 0) for name in charted}
    # one point an evaluation: few enough to serve every one in the range
    by_source = _read_sources(run, [n for n in names if n.startswith(SOURCE_SERIES_PREFIX)], axis.unit, first, last)
    by_source |= _read_scores(run, [n for n in names if n.startswith(EVAL_SERIES_PREFIX)], axis.unit, first, last)
    served |= {name: _downsample(*by_source[name], frame, origin, raw=True) for name in by_source}
    return _answer(axis.unit, frame, width(level), served)


def _answer(unit: str, frame: Frame | None, block_steps: int, series: dict) -> dict:
    return {"x": unit, "frame": frame.describe() if frame else None, "block_steps": block_steps, "series": series}


def _empty() -> dict:
    return {"points": [], "downsampled": False, "count": 0}


# The columns holding x for each unit: in a step row, and for a block's lowest and highest point.
X_COLUMNS = {"step": ("step", "min_step", "max_step"), "tokens": ("tokens_seen", "min_tokens", "max_tokens"),
             "time": ("wall_time", "min_wall", "max_wall")}
Candidate = tuple[float, int, float | None]  # value, step, x as stored


def _read(run: Run, names: list[str], unit: str,
          parts: list[tuple[int, int, int]]) -> dict[str, tuple[list[Candidate], int]]:
    """For each series, the points that may be served from ``parts`` (level, first, last) and how many points the
    parts hold: a step row gives its point, a block its lowest and highest."""
    points: dict[str, list[Candidate]] = {name: [] for name in names}
    counts = dict.fromkeys(names, 0)
    x_step, x_low, x_high = X_COLUMNS[unit]
    steps = [Q(step__range=(lo, hi)) for level, lo, hi in parts if level == 0]
    if steps:
        rows = SeriesStep.objects.filter(Q(run=run) & reduce(operator.or_, steps))
        for step, x, *values in rows.values_list("step", x_step, *names):
            for name, value in zip(names, values):
                if value is not None:
                    points[name].append((value, step, x))
                    counts[name] += 1
    blocks = [Q(level=level, bucket__range=(lo, hi)) for level, lo, hi in parts if level > 0]
    if blocks:
        by_id = {SERIES_BY_NAME[name].value: name for name in names}
        rows = SeriesBucket.objects.filter(Q(run=run, series__in=list(by_id)) & reduce(operator.or_, blocks))
        for series, count, low, low_step, low_x, high, high_step, high_x in rows.values_list(
                "series", "count", "min_value", "min_step", x_low, "max_value", "max_step", x_high):
            name = by_id[series]
            points[name] += [(low, low_step, low_x), (high, high_step, high_x)]
            counts[name] += count
    return {name: (points[name], counts[name]) for name in names}


def _read_sources(run: Run, names: list[str], unit: str, first: int,
                  last: int) -> dict[str, tuple[list[Candidate], int]]:
    """Like ``_read``, for blend sources' validation losses ("val_loss:<source>"): every evaluation in the steps,
    placed on the x axis by its step's row."""
    sources = {name.removeprefix(SOURCE_SERIES_PREFIX): name for name in names}
    rows = list(SourceValLoss.objects.filter(run=run, source__in=list(sources), step__range=(first, last))
                .values_list("source", "step", "val_loss"))
    x_of = None if unit == "step" else dict(
        SeriesStep.objects.filter(run=run, step__in={step for _, step, _ in rows})
        .values_list("step", X_COLUMNS[unit][0]))
    points: dict[str, list[Candidate]] = {name: [] for name in names}
    for source, step, value in rows:
        points[sources[source]].append((value, step, step if x_of is None else x_of.get(step)))
    return {name: (found, len(found)) for name, found in points.items()}


def _read_scores(run: Run, names: list[str], unit: str, first: int,
                 last: int) -> dict[str, tuple[list[Candidate], int]]:
    """Like ``_read_sources``, for an evaluation set's headline score on the run's checkpoints ("eval:<set id>"): the
    latest done evaluation of each checkpoint itself (not of a deployment) in the steps, at the checkpoint's step."""
    sets = {int(name.removeprefix(EVAL_SERIES_PREFIX)): name for name in names}
    rows = (Evaluation.objects.filter(checkpoint__run=run, deployment__isnull=True, status=Evaluation.Status.DONE,
                                      eval_set_id__in=list(sets), checkpoint__step__range=(first, last))
            .order_by("created_at", "id").values_list("eval_set_id", "eval_set__kind", "checkpoint__step", "report"))
    latest = {(set_id, step): headline_of(kind, scores) for set_id, kind, step, scores in rows}
    x_of = None if unit == "step" else dict(
        SeriesStep.objects.filter(run=run, step__in={step for _, step in latest})
        .values_list("step", X_COLUMNS[unit][0]))
    points: dict[str, list[Candidate]] = {name: [] for name in names}
    for (set_id, step), headline in sorted(latest.items()):
        if headline is not None:
            points[sets[set_id]].append((headline[1], step, step if x_of is None else x_of.get(step)))
    return {name: (found, len(found)) for name, found in points.items()}


def _downsample(candidates: list[Candidate], count: int, frame: Frame, origin: float, raw: bool) -> dict:
    """Each bin's lowest and highest candidate (the earliest step wins a tie), or every point when the range
    holds no more than asked. The loop of every chart query: locals only, no calls but the dictionary's."""
    start, end, bin_width, last_bin = frame.start, frame.end, frame.bin_width, frame.bins - 1
    if raw and count <= frame.points:
        kept = sorted((p for p in candidates if p[2] is not None and start <= p[2] - origin <= end),
                      key=lambda p: p[1])
        return {"points": [[x - origin, value] for value, _, x in kept], "downsampled": False, "count": count}
    lows: dict[int, Candidate] = {}
    highs: dict[int, Candidate] = {}
    for point in candidates:
        value, step, x = point
        if x is None or not start <= x - origin <= end:
            continue
        i = int((x - origin - start) / bin_width)
        if i > last_bin:
            i = last_bin
        low = lows.get(i)
        if low is None or value < low[0] or (value == low[0] and step < low[1]):
            lows[i] = point
        high = highs.get(i)
        if high is None or value > high[0] or (value == high[0] and step < high[1]):
            highs[i] = point
    kept = sorted({*lows.values(), *highs.values()}, key=lambda p: p[1])
    return {"points": [[x - origin, value] for value, _, x in kept], "downsampled": len(kept) < count,
            "count": count}
