"""A profile's timeline as one SVG picture: for each rank, what it did over the profiled steps (compute, exposed
communication, idle, and the micro-batch actions the trace names) and under it what the plan's pipeline schedule
would do with free communication (trainer.planner.schedule), on one time axis in ms.

Read from the profile folder: ``timeline-rank-<r>.json`` (trainer/profiling/timeline.py writes one beside each
rank's trace) and, when the trainer recorded it, ``schedule-rank-<r>.json``: the order of compute actions torch's
schedule runs on every pipeline rank. The ideal rows simulate that order; without one, the order the plan's
schedule generates (GPipe, 1F1B, interleaved 1F1B). One unit of the ideal schedule (one stage's forward) is set to
the measured work per unit (the compute inside the labelled actions, or all compute when none is labelled, over
the units the schedule gives a rank), so an ideal row is the same work laid out without waits: the gap between the
two rows is time lost to transfers, host overhead and the schedule's own bubble, which the ideal row shows alone.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from trainer.contract import ParallelPlan, SpecError
from trainer.contract.runfolder import read_json
from trainer.planner.schedule import GENERATED, ScheduleError, Simulation, orders_from_json, schedule_orders, simulate

from ..models import Profile, Run

TIMELINE_FILE = re.compile(r"^timeline-rank-(\d{1,7})\.json$")  # trainer.profiling.timeline.TIMELINE
SCHEDULE_FILE = re.compile(r"^schedule-rank-(\d{1,7})\.json$")
MAX_RANKS = 32  # rows drawn; the rest are named in the notes
WRITE_AGAIN = "python -m trainer.profiling.timeline <run folder>/profiles/{name}"

# Layout (px): the plot is 1,200 px wide, the resolution the trainer repacks its spans to.
LEFT, PLOT, RIGHT = 150, 1200, 210
ACTIONS_H, ROW_H, GAP, RANK_GAP = 14, 18, 3, 14
COLOURS = {"compute": "#126b2f", "comm": "#c2410c", "idle": "#c9ced6",  # the profile table's own (runs.css)
           "F": "#0b57b8", "B": "#6d28d9", "I": "#9d174d", "W": "#0f766e", "FB": "#334155", "ideal-idle": "#eef0f3"}
NAMES = {"compute": "compute", "comm": "exposed communication", "idle": "idle", "F": "forward", "B": "backward",
         "I": "backward for inputs", "W": "backward for weights", "FB": "forward and backward overlapped"}


class NoTimeline(Exception):
    """Why a profile has no timeline to draw, and what to do about it."""


@dataclass
class Ideal:
    simulation: Simulation
    schedule: str
    source: str  # what the order was read from
    pp_rank_of: dict[int, int]  # global rank → pipeline rank
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- reading


def profile_folder(run: Run, profile: Profile) -> Path:
    """The profile's folder, which must lie inside the run's folder (its path comes from the run folder's events)."""
    if not run.run_dir or not profile.path:
        raise NoTimeline(f"profile {profile.name} has no folder recorded")
    root, folder = Path(run.run_dir).resolve(), Path(profile.path).resolve()
    if not folder.is_relative_to(root):
        raise NoTimeline(f"profile {profile.name}'s folder is not inside the run's folder")
    if not folder.is_dir():
        raise NoTimeline(f"profile {profile.name}'s folder {folder} is gone from the run folder")
    return folder


def _numbered(folder: Path, pattern: re.Pattern) -> dict[int, Path]:
    found = {}
    for path in folder.iterdir():
        match = pattern.match(path.name)
        if match and path.is_file() and path.resolve().is_relative_to(folder):
            found[int(match.group(1))] = path
    return found


def timeline_missing(run: Run, profile: Profile) -> str:
    """Why the profile's timeline cannot be drawn ("" when it can): for the run page, without reading the files."""
    try:
        folder = profile_folder(run, profile)
    except NoTimeline as exc:
        return str(exc)
    if not _numbered(folder, TIMELINE_FILE):
        return (f"profile {profile.name} has no timeline: it was written before timelines were, or writing it "
                f"failed (the rank's log says why). Write it from the traces with "
                f"`{WRITE_AGAIN.format(name=profile.name)}`")
    return ""


def _rank_timelines(folder: Path) -> dict[int, dict]:
    out = {}
    for rank, path in sorted(_numbered(folder, TIMELINE_FILE).items()):
        data = read_json(path)
        if isinstance(data, dict) and isinstance(data.get("spans"), dict):
            out[rank] = data
    return out


def _plan(run: Run) -> ParallelPlan | None:
    try:
        return run.run_spec().plan
    except SpecError:
        return None


def _recorded(folder: Path) -> dict[int, dict]:
    out = {}
    for rank, path in _numbered(folder, SCHEDULE_FILE).items():
        data = read_json(path)
        if isinstance(data, dict):
            out[rank] = data
    return out


def ideal_schedule(plan: ParallelPlan | None, folder: Path, ranks: list[int]) -> tuple[Ideal | None, str]:
    """The ideal schedule to draw beside the measured ranks, or None and why there is none."""
    recorded = _recorded(folder)
    pp_rank_of = {}
    for rank in ranks:
        pp_rank = recorded.get(rank, {}).get("pp_rank")
        if isinstance(pp_rank, int):
            pp_rank_of[rank] = pp_rank
        elif plan is not None:
            pp_rank_of[rank] = rank // (plan.dp * plan.tp)  # the mesh is (pp, dp, tp), tp innermost
    notes = []
    for rank in sorted(recorded):
        data = recorded[rank]
        try:
            simulation = simulate(orders_from_json(data.get("order")))
        except ScheduleError as exc:
            notes.append(f"the order recorded beside the trace does not run ({exc})")
            break
        return Ideal(simulation, str(data.get("schedule", "recorded")), "the order torch's schedule recorded",
                     pp_rank_of), ""
    if plan is None:
        return None, "the run has no stored plan to draw an ideal schedule from"
    if plan.pp == 1:
        return None, "no pipeline (pp = 1): the ideal step is compute back to back, without a bubble"
    if plan.pipeline_schedule not in GENERATED:
        return None, "; ".join(notes + [f"the {plan.pipeline_schedule} schedule's ideal is drawn from the order the "
                                        f"trainer records beside the trace, and this profile has none"])
    orders = schedule_orders(plan.pipeline_schedule, plan.pp, plan.grad_accum, plan.model_chunks)
    source = (f"the {plan.pipeline_schedule} order generated from the plan (pp {plan.pp}, "
              f"{plan.grad_accum} micro-batches" + (f", {plan.model_chunks} stages a rank" if plan.model_chunks > 1
                                                   else "") + ")")
    return Ideal(simulate(orders), plan.pipeline_schedule, source, pp_rank_of, notes), ""


# ---------------------------------------------------------------------------------------------- drawing


def _f(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") or "0"


def _tick_step(span_ms: float) -> float:
    raw = span_ms / 8 if span_ms > 0 else 1
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _spans(data: dict, kind: str) -> list[tuple[float, float]]:
    out = []
    for item in data["spans"].get(kind) or []:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(v, (int, float)) for v in item):
            out.append((float(item[0]), float(item[1])))
    return out


def _actions(data: dict) -> list[dict]:
    return [a for a in data.get("actions") or [] if isinstance(a, dict) and isinstance(a.get("label"), str)
            and isinstance(a.get("start"), (int, float)) and isinstance(a.get("end"), (int, float))]


def _number(value, default: float = 0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else default


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time two sorted lists of disjoint spans share."""
    shared, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        shared += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def _unit_ms(timelines: dict[int, dict], ideal: Ideal) -> float:
    """ms of one ideal unit: the measured work over the units the ideal schedule gives those ranks. The work is the
    compute inside the labelled actions (GPipe's ranges also hold the wait for the neighbour's tensor), or all of
    a rank's compute when nothing is labelled."""
    work = units = 0.0
    for rank, data in timelines.items():
        pp_rank = ideal.pp_rank_of.get(rank)
        try:
            busy = ideal.simulation.rank(pp_rank).busy if pp_rank is not None else 0.0
        except KeyError:
            continue
        actions = sorted((a["start"], a["end"]) for a in _actions(data))
        work += _overlap(_spans(data, "compute"), actions) if actions else _number(data.get("compute_ms"))
        units += busy * max(1, int(_number(data.get("steps"), 1)))
    return work / units if work > 0 and units > 0 else 1.0


class _Canvas:
    def __init__(self, px_per_ms: float):
        self.px_per_ms, self.parts = px_per_ms, []

    def x(self, ms: float) -> float:
        return LEFT + ms * self.px_per_ms

    def rect(self, start_ms: float, end_ms: float, y: float, h: float, colour: str, extra: str = "") -> None:
        width = (end_ms - start_ms) * self.px_per_ms
        if width >= 0.01:
            self.parts.append(f'<rect x="{_f(self.x(start_ms))}" y="{_f(y)}" width="{_f(width)}" height="{_f(h)}" '
                              f'fill="{colour}"{extra}/>')

    def text(self, x: float, y: float, body: str, extra: str = "") -> None:
        self.parts.append(f'<text x="{_f(x)}" y="{_f(y)}"{extra}>{escape(body)}</text>')


def _labelled_box(canvas: _Canvas, start: float, end: float, y: float, h: float, kind: str, label: str,
                  tooltip: str, extra: str = "") -> None:
    colour = COLOURS.get(kind, COLOURS["FB"])
    width = (end - start) * canvas.px_per_ms
    canvas.parts.append(f'<g{extra}><title>{escape(tooltip)}</title>')
    canvas.rect(start, end, y, h, colour, ' stroke="#ffffff" stroke-width="0.5"')
    if width >= 6.5 * len(label) + 2:
        canvas.text(canvas.x(start) + width / 2, y + h - 3.5, label,
                    ' text-anchor="middle" fill="#ffffff" font-size="10"')
    canvas.parts.append("</g>")


def render_timeline(title: str, timelines: dict[int, dict], ideal: Ideal | None, notes: list[str]) -> str:
    """The SVG (module docstring) of the given ranks' timeline files beside the ideal schedule."""
    ranks = sorted(timelines)[:MAX_RANKS]
    if len(timelines) > MAX_RANKS:
        notes = notes + [f"the first {MAX_RANKS} of {len(timelines)} ranks are drawn"]
    unit = _unit_ms({r: timelines[r] for r in ranks}, ideal) if ideal else 1.0
    ideal_end = {}
    for rank in ranks:
        data = timelines[rank]
        if ideal and rank in ideal.pp_rank_of:
            ideal_end[rank] = ideal.simulation.makespan * unit * max(1, int(_number(data.get("steps"), 1)))
    span_ms = max([_number(timelines[r].get("end_ms")) for r in ranks] + list(ideal_end.values()) + [1e-6])
    tick = _tick_step(span_ms)
    span_ms = math.ceil(span_ms / tick) * tick
    canvas = _Canvas(PLOT / span_ms)

    legend_y, axis_y = 40, 78
    y = axis_y + 10
    summary = []
    body_start = len(canvas.parts)
    for rank in ranks:
        data = timelines[rank]
        steps = max(1, int(_number(data.get("steps"), 1)))
        wall = _number(data.get("wall_ms"))
        compute, idle = _number(data.get("compute_ms")), _number(data.get("idle_ms"))
        bubble = 1 - compute / wall if wall else 0.0
        canvas.parts.append(f'<g data-rank="{rank}">')
        # the actions the trace names, over the measured row
        canvas.parts.append('<g data-row="actions">')
        actions = _actions(data)
        several = len({a.get("stage") for a in actions}) > 1  # name the stage, as torch does: 2F0
        for a in actions:
            stage = f"stage {a['stage']} " if isinstance(a.get("stage"), int) else ""
            shown = f"{a['stage']}{a['label']}" if several and stage else a["label"]
            _labelled_box(canvas, a["start"], a["end"], y, ACTIONS_H, str(a.get("kind")), shown,
                          f"rank {rank}, step {a.get('step')}: {stage}{NAMES.get(a.get('kind'), a.get('kind'))} "
                          f"of micro-batch {a.get('microbatch')}, {a['end'] - a['start']:.2f} ms",
                          f' data-label="{escape(a["label"])}" data-step="{a.get("step")}"')
        canvas.parts.append("</g>")
        y += ACTIONS_H + 1
        canvas.text(LEFT - 6, y + ROW_H - 5, f"rank {rank}", ' text-anchor="end" font-weight="600"')
        canvas.parts.append(f'<g data-row="measured"><title>rank {rank} as measured: {wall:.1f} ms over {steps} '
                            f'step{"s" if steps != 1 else ""}, compute {compute:.1f} ms, exposed communication '
                            f'{_number(data.get("comm_exposed_ms")):.1f} ms, idle {idle:.1f} ms</title>')
        for kind in ("idle", "comm", "compute"):
            for start, end in _spans(data, kind):
                canvas.rect(start, end, y, ROW_H, COLOURS[kind], f' data-kind="{kind}"')
        canvas.parts.append("</g>")
        canvas.text(LEFT + PLOT + 8, y + ROW_H - 5, f"bubble {100 * bubble:.1f}% (idle {100 * idle / wall:.1f}%)"
                    if wall else "no profiled time")
        line = f"rank {rank}: not computing {100 * bubble:.1f}% of {wall:.1f} ms"
        y += ROW_H + GAP
        if rank in ideal_end:
            pp_rank = ideal.pp_rank_of[rank]
            try:
                planned = ideal.simulation.rank(pp_rank)
            except KeyError:
                planned = None
            if planned is not None:
                period = ideal.simulation.makespan * unit
                stages = len({span.stage for span in planned.spans}) > 1
                canvas.text(LEFT - 6, y + ROW_H - 5, f"ideal, pp rank {pp_rank}", ' text-anchor="end" fill="#4a5563"')
                canvas.parts.append(f'<g data-row="ideal"><title>pipeline rank {pp_rank} in the ideal {ideal.schedule} '
                                    f'schedule: idle {100 * planned.idle_share:.1f}% of each step</title>')
                for step in range(steps):
                    canvas.rect(step * period, (step + 1) * period, y, ROW_H, COLOURS["ideal-idle"],
                                ' data-kind="ideal-idle"')
                    for span in planned.spans:
                        _labelled_box(canvas, step * period + span.start * unit, step * period + span.end * unit, y,
                                      ROW_H, span.kind,
                                      f"{span.stage if stages else ''}{span.kind}{span.microbatch}",
                                      f"ideal: stage {span.stage} {NAMES[span.kind]} of micro-batch {span.microbatch}",
                                      f' data-label="{span.kind}{span.microbatch}" data-kind="ideal-{span.kind}"')
                canvas.parts.append("</g>")
                canvas.text(LEFT + PLOT + 8, y + ROW_H - 5, f"ideal bubble {100 * planned.idle_share:.1f}%",
                            ' fill="#4a5563"')
                line += f", ideal {100 * planned.idle_share:.1f}%"
                y += ROW_H + GAP
        canvas.parts.append("</g>")
        summary.append(line)
        y += RANK_GAP
    body = canvas.parts[body_start:]
    del canvas.parts[body_start:]

    # the time axis, its grid, and the legend
    ticks = int(round(span_ms / tick))
    for i in range(ticks + 1):
        x = canvas.x(i * tick)
        canvas.parts.append(f'<line x1="{_f(x)}" y1="{axis_y}" x2="{_f(x)}" y2="{_f(y - RANK_GAP)}" '
                            f'stroke="#d5dae1" stroke-width="1"/>')
        canvas.text(x, axis_y - 4, f"{i * tick:g} ms", ' text-anchor="middle" font-size="11" fill="#4a5563"')
    x = LEFT
    for key in ("compute", "comm", "idle", "F", "B", "I", "W"):
        canvas.rect((x - LEFT) / canvas.px_per_ms, (x - LEFT + 12) / canvas.px_per_ms, legend_y - 10, 12, COLOURS[key])
        canvas.text(x + 16, legend_y, NAMES[key], ' font-size="12"')
        x += 24 + 7 * len(NAMES[key])
    canvas.parts += body
    if ideal:
        notes = [f"ideal rows: {ideal.source}, one forward = {unit:.3g} ms (the measured work per unit), "
                 f"communication free"] + ideal.notes + notes
    resolution = max((_number(timelines[r].get("resolution_ms")) for r in ranks), default=0.0)
    if resolution:
        notes.append(f"detail finer than {resolution:.3g} ms (a pixel at full width) is repacked within its pixel; "
                     f"every total is exact")
    for note in notes:
        y += 4
        canvas.text(LEFT, y + 10, note, ' font-size="11" fill="#4a5563"')
        y += 14
    height = y + 10
    width = LEFT + PLOT + RIGHT
    description = "; ".join(summary) + "."
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {_f(height)}" width="{width}" '
            f'height="{_f(height)}" role="img" aria-label={quoteattr(title + ". " + description)} '
            f'aria-labelledby="timeline-title timeline-desc" data-px-per-ms="{canvas.px_per_ms!r}" '
            f'font-family="system-ui, sans-serif" font-size="12" fill="#1d232b">'
            f'<title id="timeline-title">{escape(title)}</title><desc id="timeline-desc">{escape(description)}</desc>'
            f'<rect width="100%" height="100%" fill="#ffffff"/>'
            f'<text x="{LEFT}" y="18" font-size="14" font-weight="600">{escape(title)}</text>'
            + "".join(canvas.parts) + "</svg>")


def profile_timeline_svg(run: Run, profile: Profile) -> str:
    """The picture of one profile of a run; NoTimeline says why there is none."""
    folder = profile_folder(run, profile)
    timelines = _rank_timelines(folder)
    if not timelines:
        raise NoTimeline(timeline_missing(run, profile) or f"profile {profile.name}'s timelines cannot be read")
    plan = _plan(run)
    ideal, why = ideal_schedule(plan, folder, sorted(timelines))
    notes = [why] if why else []
    for rank, data in sorted(timelines.items()):
        if data.get("labels_note"):
            notes.append(f"rank {rank}: micro-batches {data['labels_note']}")
        elif data.get("labels") == "operators":
            notes.append(f"rank {rank}: micro-batches matched from operators (the schedule names none)")
    schedule = f"the ideal {ideal.schedule} schedule" if ideal else "no ideal schedule"
    title = f"Run {run.pk}, profile {profile.name}: each rank as measured, beside {schedule}"
    return render_timeline(title, timelines, ideal, notes)
