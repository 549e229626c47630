"""Digest torch.profiler traces into compute / communication / idle shares per rank, and merge the ranks.

Files, under ``<run>/profiles/<name>/``:

    rank-<r>.trace.json.gz    torch.profiler chrome trace of the profiled steps, gzipped
    summary-rank-<r>.json     that trace digested (``summarize_trace``), written by the rank itself
    summary.json              all ranks merged (``write_summary``), written by rank 0 after a barrier

Definitions (all per rank, in one trace; times are interval unions, so nothing is counted twice):

* wall: the union of the ``ProfilerStep#<n>`` spans, i.e. the profiled steps end to end. Everything else is
  clipped to it.
* timeline: the events analysed. On a GPU trace, the device's kernels and memory copies (per stream); on a CPU-only
  trace, the host operators (per thread). Host operators of a GPU trace only launch work and are not counted.
* communication: events whose name marks a collective or point-to-point transfer: ``gloo:…`` and ``nccl:…``
  annotations (gloo runs collectives on its own ``pt_gloo_runloop`` threads, and records a blocking ``gloo:recv``
  on the caller's thread), ``c10d::…`` and ``_c10d_functional::…`` operators, ``record_param_comms`` and NCCL kernels.
  The two kinds differ: an operator is a call its thread is inside, and covers its children (the copies inside a
  collective are communication); a ``gloo:``/``nccl:`` annotation marks a transfer in flight, from issue to
  completion, and the issuing thread may compute meanwhile (gloo's ``gloo:send`` of an ``isend`` lasts until the
  peer has received it, while the sender runs its next micro-batch).
* compute: time covered by a non-communication operator (``cpu_op`` category on the host, kernels on the device) on
  a thread or stream, minus the time that thread is inside a communication operator. Annotation ranges
  (``record_function`` labels such as ``Optimizer.step#…`` or ``DistributedDataParallel.forward``) are labels, not
  work: a rank blocked inside one, waiting for a collective, must not count as computing.
* exposed communication: communication time during which no thread or stream of the rank computes; overlapped
  communication is the rest (a gradient all-reduce running while backward goes on).
* idle: wall − (compute ∪ communication): Python between operators, data loading, sleeps, waits no event records.

compute + exposed communication + idle = wall, so their shares sum to 1. Overlapped communication is reported
beside them, as a share of wall too.

``bubble`` = 1 − compute share = exposed communication + idle: the fraction of a step in which a rank does no work.
For a pipeline stage this is the time it waits for activations or gradients from its neighbours (recorded as
``gloo:recv``/``nccl:recv`` — exposed communication — or as gaps), plus transfer time and host overhead.
With p equal stages, m micro-batches and free transfers, a GPipe or 1F1B stage computes m units of work in
m + p − 1 units of time, so its bubble is (p − 1)/(m + p − 1): the figure to compare against. The measured one is
higher by the real transfer time and the host overhead, which the no-pipeline baseline's bubble estimates.

Top operators: by self time (duration minus that of operators nested in it on the same thread; an annotation's is its
duration), over the timeline's operators and communication events, with counts. MFU is computed elsewhere (it
needs the model's FLOPs).

Standard library only, so an ingesting worker can digest traces; ``profiler.StepProfiler`` records them.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.contract.runfolder import read_json, write_json_atomic
from trainer.profiling.intervals import Interval, intersect, subtract, total, union

__all__ = ["summarize_trace", "summarize_traces", "write_summary", "is_communication", "trace_time", "TraceTime",
           "complete_events", "TOP_OPS"]

TOP_OPS = 15
_COMM = re.compile(r"^(gloo:|nccl:|c10d::|c10d:|_c10d_functional::|c10d_functional::|record_param_comms"
                   r"|ncclKernel|ncclDevKernel)")
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_STEP = re.compile(r"^ProfilerStep#\d+$")
_TRACE_RE = re.compile(r"^rank-(\d+)\.trace\.json(\.gz)?$")
_SUMMARY_RE = re.compile(r"^summary-rank-(\d+)\.json$")


def is_communication(name: str) -> bool:
    return bool(_COMM.match(name))


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {"traceEvents": data}


def _self_times(events: list[dict]) -> dict[int, float]:
    """Self time by event identity: an operator's duration minus that of the operators directly nested in it on
    its thread. Annotations (gloo:/nccl: transfers in flight) do not nest, they overlap: their self time is their
    duration, and operators that run meanwhile are not theirs."""
    self_time = {id(e): float(e["dur"]) for e in events}
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") != "user_annotation":
            by_thread[(e["pid"], e["tid"])].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                parent = stack[-1]
                self_time[id(parent)] -= min(e["dur"], parent["ts"] + parent["dur"] - e["ts"])
            stack.append(e)
    return self_time


@dataclass(frozen=True)
class TraceTime:
    """One rank's trace as the module docstring defines it: the sets of time (µs, sorted disjoint intervals) that
    its shares measure, and what they were read from. ``timeline.py`` draws these same sets."""

    steps: list[dict]               # the ProfilerStep#<n> spans kept, by start
    timeline_name: str              # "device" or "cpu"
    timeline: list[dict]            # the events analysed
    window: list[Interval]          # the profiled steps end to end (wall)
    compute: list[Interval]
    comm: list[Interval]
    exposed: list[Interval]         # communication during which nothing computes
    idle: list[Interval]            # wall − (compute ∪ communication)


def complete_events(path: str | os.PathLike) -> list[dict]:
    """The trace's complete events (``ph == "X"``) with a start and a duration."""
    return [e for e in _load(Path(path)).get("traceEvents", [])
            if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float)) and "ts" in e]


def trace_time(events: list[dict], steps: int | None = None) -> TraceTime:
    """Measure a trace's complete events (``complete_events``) by the definitions in the module docstring.

    ``steps`` keeps only the first so many profiled steps: a profiler stopped mid-window also records the unfinished
    step from the last ``step()`` call to the stop, which is not a training step.
    """
    spans = sorted((e for e in events if _STEP.match(e.get("name", "")) and e.get("cat") != "gpu_user_annotation"),
                   key=lambda e: e["ts"])[:steps]
    device = [e for e in events if e.get("cat") in _DEVICE_CATS]
    if device:
        timeline, name = device, "device"
    else:
        timeline, name = [e for e in events if e.get("cat") == "cpu_op" or
                          (is_communication(e.get("name", "")) and not e.get("cat", "").startswith("gpu"))], "cpu"
    if spans:
        window = union((e["ts"], e["ts"] + e["dur"]) for e in spans)
    elif timeline:  # a trace taken without a step schedule: its whole span
        window = [(min(e["ts"] for e in timeline), max(e["ts"] + e["dur"] for e in timeline))]
    else:
        window = []

    comm_parts, compute_parts = [], []
    threads: dict[tuple, list[dict]] = defaultdict(list)
    for e in timeline:
        threads[(e["pid"], e["tid"])].append(e)
    for evs in threads.values():
        comm_parts.extend((e["ts"], e["ts"] + e["dur"]) for e in evs if is_communication(e["name"]))
        # Only communication *operators* are calls the thread is inside; annotations mark a transfer in flight.
        inside_comm = union((e["ts"], e["ts"] + e["dur"]) for e in evs
                            if is_communication(e["name"]) and e.get("cat") != "user_annotation")
        work_t = union((e["ts"], e["ts"] + e["dur"]) for e in evs if not is_communication(e["name"]))
        compute_parts.extend(subtract(work_t, inside_comm))
    comm = intersect(union(comm_parts), window)
    compute = intersect(union(compute_parts), window)
    return TraceTime(steps=spans, timeline_name=name, timeline=timeline, window=window, compute=compute, comm=comm,
                     exposed=subtract(comm, compute), idle=subtract(window, union(compute + comm)))


def summarize_trace(path: str | os.PathLike, steps: int | None = None,
                    events: list[dict] | None = None) -> dict[str, Any]:
    """Digest one rank's chrome trace (plain or gzipped) by the definitions in the module docstring. Times in ms.
    ``steps`` as for ``trace_time``; ``events``, the trace's complete events when the caller has read them."""
    path = Path(path)
    measured = trace_time(complete_events(path) if events is None else events, steps)
    spans, timeline, window = measured.steps, measured.timeline, measured.window
    wall = total(window)

    def ms(us: float) -> float:  # chrome traces count microseconds
        return round(us / 1000.0, 4)

    def share(us: float) -> float:
        return us / wall if wall else 0.0

    compute_us, comm_us, exposed_us = total(measured.compute), total(measured.comm), total(measured.exposed)
    idle_us = total(measured.idle)
    return {
        "trace": path.name,
        "timeline": measured.timeline_name,
        "steps": len(spans),
        "step_ms": [ms(e["dur"]) for e in spans],
        "wall_ms": ms(wall),
        "compute_ms": ms(compute_us),
        "comm_ms": ms(comm_us),
        "comm_exposed_ms": ms(exposed_us),
        "comm_overlapped_ms": ms(comm_us - exposed_us),
        "idle_ms": ms(idle_us),
        "shares": {"compute": share(compute_us), "comm_exposed": share(exposed_us), "idle": share(idle_us),
                   "comm_overlapped": share(comm_us - exposed_us), "comm": share(comm_us)},
        "bubble": share(wall - compute_us),
        "top_ops": _top_ops(timeline, window),
        "comm_ops": _comm_ops(timeline, window),
    }


def _inside(e: dict, window: list[Interval]) -> bool:
    return any(s <= e["ts"] < end for s, end in window)


def _top_ops(timeline: list[dict], window: list[Interval]) -> list[dict[str, Any]]:
    self_time = _self_times(timeline)
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for e in timeline:
        if _inside(e, window):
            s = stats[e["name"]]
            s[0] += 1
            s[1] += self_time[id(e)]
            s[2] += e["dur"]
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]
    return [{"name": n, "count": int(c), "self_ms": round(st / 1000, 4), "total_ms": round(tt / 1000, 4),
             "comm": is_communication(n)} for n, (c, st, tt) in ranked]


def _comm_ops(timeline: list[dict], window: list[Interval]) -> list[dict[str, Any]]:
    """Per communication name: count and summed duration (not a union: concurrent transfers add up)."""
    stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in timeline:
        if is_communication(e["name"]) and _inside(e, window):
            stats[e["name"]][0] += 1
            stats[e["name"]][1] += e["dur"]
    return [{"name": n, "count": int(c), "total_ms": round(t / 1000, 4)}
            for n, (c, t) in sorted(stats.items(), key=lambda kv: -kv[1][1])]


# ---------------------------------------------------------------- all ranks


def _merge(name: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary over ranks: mean shares (each rank weighs the same), the slowest wall, summed operator times."""
    ranks = sorted(ranks, key=lambda r: r.get("rank", 0))
    ok = [r for r in ranks if "shares" in r]
    keys = ("compute", "comm_exposed", "idle", "comm_overlapped", "comm")
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in ok:
        for op in r["top_ops"]:
            o = ops[op["name"]]
            o[0] += op["count"]
            o[1] += op["self_ms"]
            o[2] += op["total_ms"]
    top = sorted(ops.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]
    return {
        "name": name,
        "world": len(ranks),
        "ranks": ranks,
        "wall_ms": max((r["wall_ms"] for r in ok), default=0.0),
        "steps": max((r["steps"] for r in ok), default=0),
        "shares": {k: sum(r["shares"][k] for r in ok) / len(ok) if ok else 0.0 for k in keys},
        "bubble": sum(r["bubble"] for r in ok) / len(ok) if ok else 0.0,
        "bubble_max": max((r["bubble"] for r in ok), default=0.0),
        "top_ops": [{"name": n, "count": int(c), "self_ms": round(s, 4), "total_ms": round(t, 4),
                     "comm": is_communication(n)} for n, (c, s, t) in top],
    }


def _rank_traces(folder: Path) -> dict[int, Path]:
    found = {}
    for p in folder.iterdir() if folder.is_dir() else []:
        m = _TRACE_RE.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return found


def summarize_traces(folder: str | os.PathLike) -> dict[str, Any]:
    """Digest every ``rank-<r>.trace.json[.gz]`` in a profile folder and merge them (see ``_merge``)."""
    folder = Path(folder)
    ranks = [{"rank": r, **summarize_trace(p)} for r, p in sorted(_rank_traces(folder).items())]
    return _merge(folder.name, ranks)


def write_summary(folder: str | os.PathLike) -> dict[str, Any]:
    """Merge the ranks' ``summary-rank-<r>.json`` into ``summary.json`` (digesting a trace whose summary is missing).

    Rank 0 calls this after a barrier, once every rank has written its trace and summary.
    """
    folder = Path(folder)
    ranks: dict[int, dict[str, Any]] = {}
    for p in folder.iterdir() if folder.is_dir() else []:
        m = _SUMMARY_RE.match(p.name)
        data = read_json(p) if m else None
        if isinstance(data, dict):
            ranks[int(m.group(1))] = data
    for r, trace in _rank_traces(folder).items():
        if r not in ranks:
            ranks[r] = {"rank": r, **summarize_trace(trace)}
    merged = _merge(folder.name, list(ranks.values()))
    write_json_atomic(folder / "summary.json", merged)
    return merged
