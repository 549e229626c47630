"""A profile's timeline (webapp.selectors.timeline) drawn as one SVG picture: for each rank a row of the actions the
trace names, the measured row (compute, exposed communication, idle) and, under it, its pipeline rank in the ideal
schedule, on one time axis in ms, with a legend and the timeline's notes. The API serves it as
``GET /api/runs/<id>/profiles/<name>/timeline.svg`` and the run page shows it.
"""
from __future__ import annotations

import math
from xml.sax.saxutils import escape, quoteattr

from ..selectors.timeline import RankTimeline, Timeline

# Layout (px): the plot is 1,200 px wide, the resolution the trainer repacks its spans to.
LEFT, PLOT, RIGHT = 150, 1200, 210
ACTIONS_H, ROW_H, GAP, RANK_GAP = 14, 18, 3, 14
COLOURS = {"compute": "#126b2f", "comm": "#c2410c", "idle": "#c9ced6",  # the profile table's own (runs.css)
           "F": "#0b57b8", "B": "#6d28d9", "I": "#9d174d", "W": "#0f766e", "FB": "#334155", "ideal-idle": "#eef0f3"}
NAMES = {"compute": "compute", "comm": "exposed communication", "idle": "idle", "F": "forward", "B": "backward",
         "I": "backward for inputs", "W": "backward for weights", "FB": "forward and backward overlapped"}


def _f(x: float, places: int = 2) -> str:
    return f"{x:.{places}f}".rstrip("0").rstrip(".") or "0"


def _tick_step(span_ms: float) -> float:
    raw = span_ms / 8 if span_ms > 0 else 1
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


class _Canvas:
    def __init__(self, px_per_ms: float):
        self.px_per_ms, self.parts = px_per_ms, []

    def x(self, ms: float) -> float:
        return LEFT + ms * self.px_per_ms

    def rect(self, start_ms: float, end_ms: float, y: float, h: float, colour: str, extra: str = "") -> None:
        # A repacked pixel holds a sliver of each kind, often far under a hundredth of a pixel; drawn to a
        # thousandth and none left out, a row's drawn total stays its measured one.
        width = (end_ms - start_ms) * self.px_per_ms
        if width >= 0.0005:
            self.parts.append(f'<rect x="{_f(self.x(start_ms), 3)}" y="{_f(y)}" width="{_f(width, 3)}" '
                              f'height="{_f(h)}" fill="{colour}"{extra}/>')

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


def _ideal_end(timeline: Timeline, measured: RankTimeline) -> float | None:
    ideal = timeline.ideal
    if ideal and measured.rank in ideal.pp_rank_of:
        return ideal.simulation.makespan * timeline.unit_ms * measured.steps
    return None


def timeline_svg(timeline: Timeline) -> str:
    """The SVG (module docstring) of ``timeline``."""
    ideal, unit, title = timeline.ideal, timeline.unit_ms, timeline.title
    ends = [end for end in (_ideal_end(timeline, measured) for measured in timeline.ranks) if end is not None]
    span_ms = max([measured.end_ms for measured in timeline.ranks] + ends + [1e-6])
    tick = _tick_step(span_ms)
    span_ms = math.ceil(span_ms / tick) * tick
    canvas = _Canvas(PLOT / span_ms)

    legend_y, axis_y = 40, 78
    y = axis_y + 10
    summary = []
    for measured in timeline.ranks:
        rank, steps, wall = measured.rank, measured.steps, measured.wall_ms
        compute, idle = measured.compute_ms, measured.idle_ms
        bubble = 1 - compute / wall if wall else 0.0
        canvas.parts.append(f'<g data-rank="{rank}">')
        # the actions the trace names, over the measured row
        canvas.parts.append('<g data-row="actions">')
        actions = measured.actions
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
                            f'{measured.comm_exposed_ms:.1f} ms, idle {idle:.1f} ms</title>')
        for kind in ("idle", "comm", "compute"):
            for start, end in measured.spans[kind]:
                canvas.rect(start, end, y, ROW_H, COLOURS[kind], f' data-kind="{kind}"')
        canvas.parts.append("</g>")
        shares = f"not computing {100 * bubble:.1f}% (idle {100 * idle / wall:.1f}%)" if wall else "no profiled time"
        canvas.text(LEFT + PLOT + 8, y + ROW_H - 5, shares)
        line = f"rank {rank}: not computing {100 * bubble:.1f}% of {wall:.1f} ms"
        y += ROW_H + GAP
        if _ideal_end(timeline, measured) is not None:
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
    body = canvas.parts
    canvas.parts = []

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
    for note in timeline.notes:
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
