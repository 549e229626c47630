"""The planner's estimate of a run beside what the run measured, one row a figure, with the relative error.

The estimate is the one stored on the run (webapp.services.run_estimates makes it). The measurements come from what
ingestion stored: the step series, the memory figures of the first step records (the trainer measures the bytes it
holds on an attempt's first step, trainer/engine/loop.py), each rank's figures (webapp.selectors.rank_figures) and
the newest profile's digest. The run page and ``GET /api/runs/<id>/estimate/`` both show these rows
(docs/live-data.md).
"""
from __future__ import annotations

import math
import statistics

from django.db.models import Max

from ..models import Metric, Run, SeriesBucket, SeriesStep
from ..models.series import Series
from .rank_figures import rank_summary

# Steps whose median is "the" measured step time, throughput and MFU: the latest ones, so that warm-up, compilation
# and a resumed attempt's first steps weigh nothing once the run is under way.
RECENT_STEPS = 200
# The trainer writes the state bytes from its first step on, and every rank's on that first step alone; a handful
# of the earliest records holds them, and reading only those keeps a long run's page from scanning all its records.
FIRST_RECORDS = 10
STATES = ("params_bytes", "grads_bytes", "optimizer_bytes")
# The estimate's step terms that are communication left exposed (the planner already takes the overlapped part out)
COMMUNICATION = ("tensor_parallel", "pipeline_p2p", "data_parallel", "expert_all_to_all")
# Each row's key, in the order of the rows, and the units they come in
FIGURE_KEYS = ("model_states_rank0", "model_states_fullest", "activations_rank0", "peak_memory_rank0",
               "peak_memory_fullest", "step_time", "tokens_per_s", "mfu", "pipeline_bubble", "exposed_communication")
UNITS = ("bytes", "s", "tokens/s", "fraction")
NO_STEPS = "no training step recorded yet"
NO_STATES = ("no step record holds the model states' bytes (the trainer writes them from an attempt's first "
             "step on)")
NO_PROFILE = "no profile taken (give the run a profile to measure it)"
NO_PIPELINE = ("no pipeline (pp = 1), so no bubble: a profile's idle share is then host time between operators, "
               "not a bubble")


# -- the stored estimate ------------------------------------------------------------------------------------------

def _number(value) -> float | int | None:
    """A finite number from stored JSON, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _value(node, *keys):
    """The number at ``keys`` in the estimate's JSON, the ``value`` of a figure."""
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return _number(node.get("value") if isinstance(node, dict) else node)


def estimate_summary(estimate: dict) -> dict:
    """The headline of a stored estimate (the whole figure tree is POST /api/estimate/'s answer), or its error."""
    if "error" in estimate or not estimate:
        return {"error": str(estimate.get("error") or "no estimate")}
    memory = estimate.get("memory") or {}
    return {"peak_memory_bytes": _value(memory, "peak"), "peak_rank": memory.get("peak_rank"),
            "peak_stage": memory.get("peak_stage"), "capacity_bytes": _value(memory, "capacity"),
            "fits": memory.get("fits"), "step_time_s": _value(estimate, "time", "step"),
            "tokens_per_s": _value(estimate, "time", "tokens_per_s"), "mfu": _value(estimate, "time", "mfu"),
            "options": estimate.get("options") or {}, "calibration": estimate.get("calibration"),
            "warnings": [w for w in estimate.get("warnings") or [] if isinstance(w, str)]}


class _Planned:
    """The estimate's figures by rank: the planner gives each pipeline stage's, for data- and tensor-parallel index
    0, which every rank of the stage matches (rank = (stage·dp + d)·tp + j)."""

    def __init__(self, estimate: dict):
        plan = estimate.get("plan") or {}
        self.ranks_per_stage = max(1, int(plan.get("dp") or 1) * int(plan.get("tp") or 1))
        self.stages = {st["stage"]: st for st in (estimate.get("memory") or {}).get("stages") or []
                       if isinstance(st, dict) and isinstance(st.get("stage"), int)}
        self.estimate = estimate

    def stage_of(self, rank: int) -> dict:
        return self.stages.get(rank // self.ranks_per_stage) or {}

    def states(self, rank: int) -> float | None:
        parts = [_value(self.stage_of(rank), part) for part in ("weights", "gradients", "optimizer")]
        return None if None in parts else sum(parts)

    def fullest_states(self) -> float | None:
        """The largest model states of any stage."""
        values = [self.states(stage * self.ranks_per_stage) for stage in self.stages]
        return max((v for v in values if v is not None), default=None)

    def step_share(self, terms: tuple[str, ...]) -> float | None:
        step = _value(self.estimate, "time", "step")
        if not step:
            return None
        values = [_value(self.estimate, "time", "step", "terms", name) for name in terms]
        return sum(v for v in values if v is not None) / step


# -- what the run measured ----------------------------------------------------------------------------------------

def _state_record(run: Run) -> tuple[int, dict] | None:
    """The earliest step record holding the model states' bytes: its step and its memory figures (with every
    rank's as ``per_rank`` in a job of several ranks)."""
    fallback = None
    for step, values in (Metric.objects.filter(run=run, kind="train").order_by("step")
                         .values_list("step", "values")[:FIRST_RECORDS]):
        memory = values.get("memory") if isinstance(values, dict) else None
        if _states(memory) is None:
            continue
        if isinstance(memory.get("per_rank"), list) and memory["per_rank"]:
            return step, memory
        fallback = fallback or (step, memory)
    return fallback


def _states(memory) -> int | None:
    if not isinstance(memory, dict) or not all(isinstance(memory.get(k), int) and not isinstance(memory.get(k), bool)
                                               for k in STATES):
        return None
    return sum(memory[k] for k in STATES)


def _recent_median(run: Run, column: str) -> tuple[float | None, int]:
    values = [v for v in SeriesStep.objects.filter(run=run, **{f"{column}__isnull": False}).order_by("-step")
              .values_list(column, flat=True)[:RECENT_STEPS] if math.isfinite(v)]
    return (statistics.median(values) if values else None), len(values)


def _peak_memory(run: Run) -> float | None:
    """Rank 0's highest max_allocated_bytes over the run: the coarsest rollups cover every step, so this reads a
    row per 65,536 steps rather than the steps themselves."""
    coarsest = (SeriesBucket.objects.filter(run=run, series=Series.MEMORY).values("level")
                .order_by("-level").first())
    if coarsest is not None:
        return SeriesBucket.objects.filter(run=run, series=Series.MEMORY, level=coarsest["level"]) \
            .aggregate(peak=Max("max_value"))["peak"]
    return SeriesStep.objects.filter(run=run).aggregate(peak=Max("memory"))["peak"]


def _degree(run: Run, name: str) -> int:
    """The stored plan's ``dp``, ``tp`` or ``pp`` (1 when the spec lacks a usable one)."""
    value = ((run.spec or {}).get("plan") or {}).get(name, 1)
    return value if isinstance(value, int) and value > 0 else 1


def _world(run: Run) -> int:
    return _degree(run, "dp") * _degree(run, "tp") * _degree(run, "pp")


def _row(key: str, figure: str, unit: str, estimated, measured, measured_from: str, missing: str) -> dict:
    estimated, measured = _number(estimated), _number(measured)
    error = None
    if estimated is not None and measured is not None and estimated != 0:
        error = (measured - estimated) / estimated
    return {"key": key, "figure": figure, "unit": unit, "estimated": estimated, "measured": measured, "error": error,
            "measured_from": measured_from if measured is not None else "",
            "missing": "" if measured is not None else missing}


def estimate_rows(run: Run, estimate: dict) -> list[dict]:
    """Each figure the planner estimates beside the run's measurement of it (docs/live-data.md lists them)."""
    planned = _Planned(estimate)
    stepped = bool(run.last_step)
    world = _world(run)
    one_rank = "a world of one: its only rank is rank 0, above"

    # model states and saved activations, from the step record that holds them
    found = _state_record(run) if stepped else None
    step, memory = found if found else (None, {})
    per_rank = [m if isinstance(m, dict) else {} for m in memory.get("per_rank") or []]
    rank0 = per_rank[0] if per_rank else memory
    states_missing = NO_STEPS if not stepped else NO_STATES
    rows = [_row("model_states_rank0", "Model states, rank 0", "bytes", planned.states(0), _states(rank0),
                 f"step {step}'s memory record: params_bytes + grads_bytes + optimizer_bytes of rank 0",
                 states_missing)]
    sums = [(s, rank) for rank, s in enumerate(_states(m) for m in per_rank) if s is not None]
    if sums:
        measured, rank = max(sums, key=lambda item: (item[0], -item[1]))
        rows.append(_row("model_states_fullest", "Model states, fullest rank", "bytes", planned.states(rank),
                         measured, f"rank {rank} of {len(per_rank)}, step {step}'s memory record (its estimate is "
                                   f"that rank's)", ""))
    else:
        rows.append(_row("model_states_fullest", "Model states, fullest rank", "bytes", planned.fullest_states(), None,
                         "",
                         one_rank if world == 1 else states_missing if not found else
                         "no per-rank memory record (the trainer writes every rank's on an attempt's first step)"))
    activations = rank0.get("activations_bytes") if isinstance(rank0, dict) else None
    rows.append(_row("activations_rank0", "Saved activations, one micro-batch, rank 0", "bytes",
                     _value(planned.stage_of(0), "activations_per_microbatch"), activations,
                     f"step {step}'s memory record: bytes autograd saved in one micro-batch's forward, rank 0",
                     states_missing if not found else "the engine did not measure the activations it saves"))

    # peak memory, from the memory series and each rank's figures
    rows.append(_row("peak_memory_rank0", "Peak memory, rank 0", "bytes", _value(planned.stage_of(0), "total"),
                     _peak_memory(run) if stepped else None, "highest max_allocated_bytes of rank 0 over the run",
                     NO_STEPS if not stepped else "the device reports no memory (a CPU does not)"))
    ranks = rank_summary(run) if stepped else {"figures": {}}
    # a record without each rank's figures (a world of one) says nothing of the other ranks
    fullest = ranks["figures"].get("max_allocated_bytes") if (ranks.get("world_size") or 0) > 1 else None
    rows.append(_row("peak_memory_fullest", "Peak memory, fullest rank", "bytes",
                     _value(estimate, "memory", "peak"), fullest and fullest["max"],
                     f"rank {fullest['worst_rank']}, median over the latest steps" if fullest else "",
                     NO_STEPS if not stepped else one_rank if world == 1 else
                     "no per-rank memory recorded (the device reports none, or the records hold no rank's)"))

    # time, from the latest steps
    recent = {}
    for column in ("step_time_s", "tokens_per_s", "mfu"):
        recent[column] = _recent_median(run, column) if stepped else (None, 0)
    counted = recent["step_time_s"][1]
    median = f"median of the latest {counted} steps" if counted else ""
    rows += [
        _row("step_time", "Step time", "s", _value(estimate, "time", "step"), recent["step_time_s"][0], median,
             NO_STEPS),
        _row("tokens_per_s", "Throughput", "tokens/s", _value(estimate, "time", "tokens_per_s"),
             recent["tokens_per_s"][0], median, NO_STEPS),
        _row("mfu", "MFU", "fraction", _value(estimate, "time", "mfu"), recent["mfu"][0], median, NO_STEPS),
    ]

    # shares of a step, from the newest profile's digest (trainer.profiling.digest): a rank's profiled wall time is
    # compute + exposed communication + idle, and idle is where a pipeline's fill and drain show
    profile = run.profiles.order_by("-created_at", "-id").first()
    summary = profile.summary if profile is not None and isinstance(profile.summary, dict) else {}
    shares = summary.get("shares") if isinstance(summary.get("shares"), dict) else {}
    no_digest = NO_PROFILE if profile is None else f"profile {profile.name} has no digest of its traces"

    def source(share: str) -> str:
        return f"profile {profile.name}: {share} share of the profiled steps, mean over ranks" if profile else ""

    # without a pipeline the planner has no bubble term (0), and the idle share is no bubble to hold against it
    pipelined = _degree(run, "pp") > 1
    rows += [
        _row("pipeline_bubble", "Pipeline bubble (idle share of a step)", "fraction",
             planned.step_share(("pipeline_bubble",)), shares.get("idle") if pipelined else None,
             source("idle"), no_digest if pipelined else NO_PIPELINE),
        _row("exposed_communication", "Exposed communication (share of a step)", "fraction",
             planned.step_share(COMMUNICATION), shares.get("comm_exposed"),
             source("exposed communication"), no_digest),
    ]
    return rows
