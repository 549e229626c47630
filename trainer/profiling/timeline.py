"""One rank's profiled steps as spans to draw: compute, exposed communication and idle, and the pipeline's
micro-batch actions where the trace names them.

    profiles/<name>/timeline-rank-<r>.json    written beside the rank's trace and summary

The three kinds of time are the digest's own sets (``digest.trace_time``: compute, communication during which
nothing computes, and idle), so they tile the profiled steps and their totals are the summary's ``compute_ms``,
``comm_exposed_ms`` and ``idle_ms``. Times are ms from the start of the first profiled step.

Detail finer than a pixel of a 1,200-pixel-wide picture is repacked rather than dropped: consecutive spans shorter
than ``RESOLUTION`` of the drawn range are gathered until they fill one pixel, and that pixel is redrawn as one span
of each kind, as long as the kind's time in it (compute first, then communication, then idle). Every total stays
exact, nothing moves by more than a pixel, and a rank's file holds a few thousand spans at most whatever the trace.

Micro-batch actions, from the ranges torch.distributed.pipelining records:

* ``PP:<stage><kind><micro-batch>`` (``PP:0F1``, ``PP:1I0``, ``PP:1W0``, ``PP:1B0``): every multi-stage schedule
  (interleaved 1F1B and the zero-bubble ones) wraps each action in one;
* ``Forward <i>`` and ``Backward <i>``: GPipe;
* nothing: Schedule1F1B records no range. Its actions are then matched from the operators of the busiest host
  thread: between two communication calls, a stretch of autograd's backward functions is a backward, and a stretch
  of other operators that runs a matrix multiply is a forward (batch preparation, gradient clipping and the
  optimizer run none). Single-stage schedules run forwards and backwards each in micro-batch order, so the i-th of
  each in a step is micro-batch i. A step whose forward and backward counts differ from each other (or from the
  recorded micro-batch count) is left unlabelled rather than guessed, and the file says so. A device trace's
  kernels cannot be matched this way: they are left unlabelled.

Standard library only, like the digest.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from trainer.contract.runfolder import read_json, write_json_atomic
from trainer.profiling.digest import complete_events, is_communication, trace_time
from trainer.profiling.intervals import Interval, total

__all__ = ["timeline", "write_timeline", "write_timelines", "TIMELINE", "RESOLUTION", "KINDS"]

TIMELINE = "timeline-rank-{rank}.json"
SCHEDULE = "schedule-rank-{rank}.json"  # the order the trainer's schedule ran, when it records one
WIDTH_PX = 1200
RESOLUTION = 1 / WIDTH_PX  # of the drawn range: one pixel
KINDS = ("compute", "comm", "idle")
_TRACE = re.compile(r"^rank-(\d+)\.trace\.json(\.gz)?$")
_PP_ACTION = re.compile(r"^PP:(\d+)([FIBW])(\d+)$")
_PP_OVERLAP = re.compile(r"^PP:\((.+)\)OVERLAP_F_B$")
_GPIPE = re.compile(r"^(Forward|Backward) (\d+)$")
_BACKWARD_OP = "autograd::engine::evaluate_function:"
_MATMUL = {"aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm"}


def _ms(us: float) -> float:
    return round(us / 1000.0, 4)


# ---------------------------------------------------------------------------------------------- spans


def _segments(kinds: dict[str, list[Interval]]) -> list[tuple[float, float, str]]:
    return sorted((s, e, kind) for kind, spans in kinds.items() for s, e in spans)


def repack(kinds: dict[str, list[Interval]], resolution: float) -> tuple[dict[str, list[Interval]], int]:
    """The spans of each kind with detail finer than ``resolution`` repacked (module docstring); and how many
    pixels were repacked. The kinds' spans must not overlap; each kind's total is kept exactly."""
    out: dict[str, list[list[float]]] = {kind: [] for kind in kinds}
    order = [k for k in KINDS if k in kinds] + [k for k in kinds if k not in KINDS]
    bucket: list[tuple[float, float, str]] = []
    repacked = 0

    def emit(start: float, end: float, kind: str) -> None:
        spans = out[kind]
        if spans and abs(spans[-1][1] - start) < 1e-9:  # touching its predecessor of the same kind: one span
            spans[-1][1] = end
        else:
            spans.append([start, end])

    def flush() -> None:
        nonlocal repacked
        if not bucket:
            return
        if len(bucket) == 1:
            emit(*bucket[0])
        else:
            repacked += 1
            length = {kind: 0.0 for kind in order}
            for s, e, kind in bucket:
                length[kind] += e - s
            at = bucket[0][0]
            for kind in order:
                if length[kind] > 0:
                    emit(at, at + length[kind], kind)
                    at += length[kind]
        bucket.clear()

    for start, end, kind in _segments(kinds):
        if bucket and start > bucket[-1][1] + 1e-9:  # a gap between profiled steps: nothing may move across it
            flush()
        if end - start >= resolution:
            flush()
            emit(start, end, kind)
            continue
        bucket.append((start, end, kind))
        if bucket[-1][1] - bucket[0][0] >= resolution:
            flush()
    flush()
    return {kind: [(s, e) for s, e in spans] for kind, spans in out.items()}, repacked


# ---------------------------------------------------------------------------------------------- micro-batches


def _step_of(ts: float, steps: list[dict]) -> int | None:
    for i, step in enumerate(steps):
        if step["ts"] <= ts < step["ts"] + step["dur"]:
            return i
    return None


def _action(kind: str, stage: int | None, microbatch: int, step: int, start: float, end: float) -> dict[str, Any]:
    return {"label": f"{kind}{microbatch}", "kind": kind, "stage": stage, "microbatch": microbatch, "step": step,
            "start": start, "end": end}


def _annotated(events: list[dict], steps: list[dict], device: bool) -> list[dict[str, Any]]:
    category = "gpu_user_annotation" if device else "user_annotation"
    found = []
    for e in events:
        if e.get("cat") != category:
            continue
        step = _step_of(e["ts"], steps)
        if step is None:
            continue
        name, span = e.get("name", ""), (e["ts"], e["ts"] + e["dur"])
        if m := _PP_ACTION.match(name):
            found.append(_action(m.group(2), int(m.group(1)), int(m.group(3)), step, *span))
        elif m := _GPIPE.match(name):
            found.append(_action("F" if m.group(1) == "Forward" else "B", None, int(m.group(2)), step, *span))
        elif m := _PP_OVERLAP.match(name):  # a forward and a backward run together (DualPipeV): both, one span
            parts = [_PP_ACTION.match(f"PP:{part.strip()}") for part in m.group(1).split(";")]
            if all(parts):
                found.append({**_action("FB", None, int(parts[0].group(3)), step, *span),
                              "label": "+".join(f"{p.group(2)}{p.group(3)}" for p in parts)})
    return sorted(found, key=lambda a: a["start"])


def _top_level(ops: list[dict]) -> list[dict]:
    ops = sorted(ops, key=lambda e: (e["ts"], -e["dur"]))
    out, end = [], float("-inf")
    for e in ops:
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _matched(events: list[dict], steps: list[dict], microbatches: int | None,
             stage: int | None) -> tuple[list[dict[str, Any]], str]:
    """Forwards and backwards matched from operators (module docstring); and why a step is unlabelled, if one is."""
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    if not ops:
        return [], "the trace has no host operators to match micro-batches from"
    main = Counter((e["pid"], e["tid"]) for e in ops).most_common(1)[0][0]
    found, why = [], []
    for index, step in enumerate(steps):
        inside = [e for e in ops if (e["pid"], e["tid"]) == main and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
        stretches: list[tuple[str, list[dict]]] = []
        for op in _top_level(inside):
            name = op["name"]
            if is_communication(name):
                stretches.append(("", []))  # a communication call ends a stretch
                continue
            kind = "B" if name.startswith(_BACKWARD_OP) else "F"
            if not stretches or stretches[-1][0] != kind:
                stretches.append((kind, []))
            stretches[-1][1].append(op)
        forwards = [ops_ for kind, ops_ in stretches if kind == "F" and any(o["name"] in _MATMUL for o in ops_)]
        backwards = [ops_ for kind, ops_ in stretches if kind == "B"]
        expected = microbatches if microbatches is not None else len(forwards)
        if not (len(forwards) == len(backwards) == expected) or not forwards:
            why.append(f"step {index}: {len(forwards)} forward and {len(backwards)} backward stretches"
                       + (f" for {microbatches} micro-batches" if microbatches is not None else ""))
            continue
        for kind, stretches_ in (("F", forwards), ("B", backwards)):
            for i, run in enumerate(stretches_):
                found.append(_action(kind, stage, i, index, run[0]["ts"], max(o["ts"] + o["dur"] for o in run)))
    note = ("left unlabelled, " + "; ".join(why)) if why else ""
    return sorted(found, key=lambda a: a["start"]), note


def _recorded_schedule(trace: Path, rank: int) -> dict[str, Any]:
    data = read_json(trace.parent / SCHEDULE.format(rank=rank))
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------------------------------------- one rank


def timeline(trace: str | os.PathLike, rank: int, steps: int | None = None,
             events: list[dict] | None = None) -> dict[str, Any]:
    """One rank's timeline file (module docstring) from its trace. ``steps`` as for ``digest.trace_time``;
    ``events``, the trace's complete events when the caller has read them."""
    trace = Path(trace)
    events = complete_events(trace) if events is None else events
    measured = trace_time(events, steps)
    window = measured.window
    origin = window[0][0] if window else 0.0
    end = window[-1][1] if window else 0.0
    kinds = {"compute": measured.compute, "comm": measured.exposed, "idle": measured.idle}
    resolution = (end - origin) * RESOLUTION
    spans, repacked = repack(kinds, resolution)

    device = measured.timeline_name == "device"
    actions = _annotated(events, measured.steps, device)
    labels, note = "annotations", ""
    if not actions and device:
        labels, note = "none", "a device trace's kernels are not matched to micro-batches without the schedule's ranges"
    elif not actions:
        recorded = _recorded_schedule(trace, rank)
        microbatches = recorded.get("microbatches") if isinstance(recorded.get("microbatches"), int) else None
        one_stage = recorded.get("stages_per_rank") == 1 and isinstance(recorded.get("pp_rank"), int)
        actions, note = _matched(events, measured.steps, microbatches, recorded["pp_rank"] if one_stage else None)
        labels = "operators" if actions else "none"

    def rel(us: float) -> float:
        return _ms(us - origin)

    return {
        "rank": rank,
        "trace": trace.name,
        "timeline": measured.timeline_name,
        "steps": len(measured.steps),
        "step_starts_ms": [rel(e["ts"]) for e in measured.steps],
        "step_ms": [_ms(e["dur"]) for e in measured.steps],
        "wall_ms": _ms(total(window)),
        "end_ms": rel(end),
        "compute_ms": _ms(total(measured.compute)),
        "comm_exposed_ms": _ms(total(measured.exposed)),
        "idle_ms": _ms(total(measured.idle)),
        "resolution_ms": _ms(resolution),
        "repacked": repacked,
        "spans": {kind: [[rel(s), rel(e)] for s, e in spans[kind]] for kind in KINDS},
        "actions": [{**a, "start": rel(a["start"]), "end": rel(a["end"])} for a in actions],
        "labels": labels,
        "labels_note": note,
    }


def write_timeline(trace: str | os.PathLike, rank: int, steps: int | None = None,
                   events: list[dict] | None = None) -> dict[str, Any]:
    """Write ``timeline-rank-<r>.json`` beside the trace, and return it."""
    data = timeline(trace, rank, steps, events)
    write_json_atomic(Path(trace).parent / TIMELINE.format(rank=rank), data)
    return data


def _summary_steps(folder: Path, rank: int) -> int | None:
    """The steps the rank's own digest kept (an unfinished last step is not one), when it wrote a summary."""
    summary = read_json(folder / f"summary-rank-{rank}.json")
    steps = summary.get("steps") if isinstance(summary, dict) else None
    return steps if isinstance(steps, int) and steps > 0 else None


def write_timelines(folder: str | os.PathLike, again: bool = False) -> list[Path]:
    """Write the timeline of every trace in a profile folder that has none yet (every one with ``again``)."""
    folder, written = Path(folder), []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _TRACE.match(path.name)
        if not match:
            continue
        rank = int(match.group(1))
        target = folder / TIMELINE.format(rank=rank)
        if again or not target.exists():
            write_timeline(path, rank, _summary_steps(folder, rank))
            written.append(target)
    return written


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.profiling.timeline",
                                     description="Write the timeline of each rank's trace in profile folders "
                                                 "(those written before timelines were).")
    parser.add_argument("folders", nargs="+", help="profile folders: <run>/profiles/<name>")
    parser.add_argument("--again", action="store_true", help="rewrite timelines that exist")
    args = parser.parse_args(list(argv) if argv is not None else None)
    for folder in args.folders:
        for path in write_timelines(folder, again=args.again):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
