"""A profile's timeline as data: for each rank, what it did over the profiled steps (compute, exposed communication,
idle, and the micro-batch actions the trace names) and what the plan's pipeline schedule would do with free
communication (trainer.planner.schedule), on one time axis in ms. webapp.rendering.timeline draws it.

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

from trainer.contract import ParallelPlan, SpecError
from trainer.contract.runfolder import read_json
from trainer.contract.stages import is_uneven, stage_layer_counts
from trainer.planner.schedule import (GENERATED, ScheduleError, Simulation, orders_from_json, schedule_orders, simulate,
                                      stage_weights)

from ..models import Profile, Run

TIMELINE_FILE = re.compile(r"^timeline-rank-(\d{1,7})\.json$")  # trainer.profiling.timeline.TIMELINE
SCHEDULE_FILE = re.compile(r"^schedule-rank-(\d{1,7})\.json$")
MAX_RANKS = 32  # ranks shown; the rest are named in the notes
SPAN_KINDS = ("compute", "comm", "idle")
WRITE_AGAIN = "python -m trainer.profiling.timeline <run folder>/profiles/{name}"


class NoTimeline(Exception):
    """Why a profile has no timeline to draw, and what to do about it."""


@dataclass
class Ideal:
    simulation: Simulation
    schedule: str
    source: str  # what the order was read from
    pp_rank_of: dict[int, int]  # global rank → pipeline rank
    notes: list[str] = field(default_factory=list)


@dataclass
class RankTimeline:
    """One rank's timeline file with its figures checked: times in ms from the first profiled step's start."""

    rank: int
    steps: int
    wall_ms: float
    compute_ms: float
    comm_exposed_ms: float
    idle_ms: float
    end_ms: float
    resolution_ms: float  # detail finer than this was repacked within it
    spans: dict[str, list[tuple[float, float]]]  # for each of SPAN_KINDS, sorted and disjoint
    actions: list[dict]  # the micro-batch actions the trace names: label, kind, stage, step, microbatch, start, end

    @classmethod
    def of(cls, rank: int, data: dict) -> "RankTimeline":
        return cls(rank=rank, steps=max(1, int(_number(data.get("steps"), 1))), wall_ms=_number(data.get("wall_ms")),
                   compute_ms=_number(data.get("compute_ms")), comm_exposed_ms=_number(data.get("comm_exposed_ms")),
                   idle_ms=_number(data.get("idle_ms")), end_ms=_number(data.get("end_ms")),
                   resolution_ms=_number(data.get("resolution_ms")),
                   spans={kind: _spans(data, kind) for kind in SPAN_KINDS}, actions=_actions(data))


@dataclass
class Timeline:
    title: str
    ranks: list[RankTimeline]  # the first MAX_RANKS ranks
    ideal: Ideal | None
    unit_ms: float  # one unit of the ideal schedule (module docstring); 1.0 without one
    notes: list[str]  # what a reader of the picture should know, in the order to read it


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


def _plan(run: Run) -> tuple[ParallelPlan | None, int]:
    """The run's plan and its model's layer count (which sizes uneven stages), or (None, 0) without a stored spec."""
    try:
        spec = run.run_spec()
    except SpecError:
        return None, 0
    return spec.plan, spec.model.n_layers


def _recorded(folder: Path) -> dict[int, dict]:
    out = {}
    for rank, path in _numbered(folder, SCHEDULE_FILE).items():
        data = read_json(path)
        if isinstance(data, dict):
            out[rank] = data
    return out


def _stage_costs(plan: ParallelPlan | None, n_layers: int) -> dict[int, float] | None:
    """Each stage's cost against an equal one's when the plan's stages are uneven (None: all equal)."""
    if plan is None or not n_layers or not is_uneven(plan):
        return None
    counts = stage_layer_counts(n_layers, plan)
    return stage_weights(counts) if counts else None


def ideal_schedule(plan: ParallelPlan | None, folder: Path, ranks: list[int],
                   n_layers: int = 0) -> tuple[Ideal | None, str]:
    """The ideal schedule to draw beside the measured ranks, or None and why there is none; uneven stages (from the
    plan and the model's ``n_layers``) cost in proportion to their layers."""
    recorded = _recorded(folder)
    pp_rank_of = {}
    for rank in ranks:
        pp_rank = recorded.get(rank, {}).get("pp_rank")
        if isinstance(pp_rank, int):
            pp_rank_of[rank] = pp_rank
        elif plan is not None:
            pp_rank_of[rank] = rank // (plan.dp * plan.cp * plan.tp)  # the mesh is (pp, dp, cp, tp), tp innermost
    notes, stage_costs = [], _stage_costs(plan, n_layers)
    for rank in sorted(recorded):
        data = recorded[rank]
        try:
            simulation = simulate(orders_from_json(data.get("order")), stage_costs=stage_costs)
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
    if stage_costs:
        source += ", stages costed by their layers"
    return Ideal(simulate(orders, stage_costs=stage_costs), plan.pipeline_schedule, source, pp_rank_of, notes), ""


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


def _unit_ms(ranks: list[RankTimeline], ideal: Ideal) -> float:
    """ms of one ideal unit: the measured work over the units the ideal schedule gives those ranks. The work is the
    compute inside the labelled actions (GPipe's ranges also hold the wait for the neighbour's tensor), or all of
    a rank's compute when nothing is labelled."""
    work = units = 0.0
    for measured in ranks:
        pp_rank = ideal.pp_rank_of.get(measured.rank)
        try:
            busy = ideal.simulation.rank(pp_rank).busy if pp_rank is not None else 0.0
        except KeyError:
            continue
        actions = sorted((a["start"], a["end"]) for a in measured.actions)
        work += _overlap(measured.spans["compute"], actions) if actions else measured.compute_ms
        units += busy * measured.steps
    return work / units if work > 0 and units > 0 else 1.0


def profile_timeline(run: Run, profile: Profile) -> Timeline:
    """The timeline of one profile of a run; NoTimeline says why there is none."""
    folder = profile_folder(run, profile)
    files = _rank_timelines(folder)
    if not files:
        raise NoTimeline(timeline_missing(run, profile) or f"profile {profile.name}'s timelines cannot be read")
    plan, n_layers = _plan(run)
    ideal, why = ideal_schedule(plan, folder, sorted(files), n_layers)
    notes = [why] if why else []
    for rank, data in sorted(files.items()):
        if data.get("labels_note"):
            notes.append(f"rank {rank}: micro-batches {data['labels_note']}")
        elif data.get("labels") == "operators":
            notes.append(f"rank {rank}: micro-batches matched from operators (the schedule names none)")
    ranks = [RankTimeline.of(rank, files[rank]) for rank in sorted(files)[:MAX_RANKS]]
    if len(files) > MAX_RANKS:
        notes.append(f"the first {MAX_RANKS} of {len(files)} ranks are drawn")
    unit = _unit_ms(ranks, ideal) if ideal else 1.0
    if ideal:
        notes = [f"ideal rows: {ideal.source}, one forward = {unit:.3g} ms (the measured work per unit), "
                 f"communication free"] + ideal.notes + notes
    resolution = max((measured.resolution_ms for measured in ranks), default=0.0)
    if resolution:
        notes.append(f"detail finer than {resolution:.3g} ms (a pixel at full width) is repacked within its pixel; "
                     f"every total is exact")
    schedule = f"the ideal {ideal.schedule} schedule" if ideal else "no ideal schedule"
    return Timeline(title=f"Run {run.pk}, profile {profile.name}: each rank as measured, beside {schedule}",
                    ranks=ranks, ideal=ideal, unit_ms=unit, notes=notes)
