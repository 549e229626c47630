"""What a run folder's files hold, as named constants and small typed records (docs/architecture.md, The run folder).

    events.jsonl    one ``event`` record a line; ``Event`` names the kinds
    jobs.jsonl      one ``event`` record a line of kind ``Event.JOB_STARTED`` or ``JOB_ENDED``, written by each
                    attempt's job itself (its batch script, or the local supervisor) as it begins on its
                    allocation and as it leaves it
    metrics.jsonl   one ``StepMetrics`` record a training step, one ``EvalMetrics`` record an evaluation
    launch.json     one ``LaunchRecord``: how the current attempt was started
    heartbeats/     rank-<r>.json, one ``Heartbeat`` a rank, rewritten every few seconds
    skipped_batches.json   the run's ``Skip`` records, oldest first: where it went back after a loss spike

Writers build these records and append their ``to_dict()``; readers (workers, benchmarks, tests) use the
predicates and keys here instead of spelling field names of their own. Standard library only.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from trainer.contract.runfolder import HEARTBEATS, LAUNCH, SKIPPED_BATCHES, read_json, write_json_atomic


class Event:
    """Kinds of events.jsonl records. A run's last event is finished, stopped or failed."""

    STARTED = "started"
    CHECKPOINT_SAVED = "checkpoint_saved"
    PROFILE_WRITTEN = "profile_written"
    FLOPS_CHECK = "flops_check"  # the DeepSpeed flops profiler against the planner's formula
    FINISHED = "finished"
    STOPPED = "stopped"  # SIGTERM or --until-step: a checkpoint was saved, the run can resume
    FAILED = "failed"
    TIME_LIMIT_NEAR = "time_limit_near"  # written by a Slurm batch script when its time-limit signal came
    LOSS_SPIKE = "loss_spike"  # the run went back to its newest checkpoint, skipping the batches since (records.Skip)
    STRAGGLER = "straggler"  # a rank whose own work is slower than the others' (trainer/engine/stragglers.py)
    # jobs.jsonl's kinds: the bounds of the time an attempt held its nodes
    JOB_STARTED = "job_started"
    JOB_ENDED = "job_ended"
    # Events that say where a run stands (the web app's status follows the last of these)
    MILESTONES = (STARTED, FINISHED, STOPPED, FAILED)


# Every record rank 0 writes (events and metrics rows) carries, besides its own fields:
#   "attempt"  the attempt of the run that wrote it (ATTEMPT_ENV, set by the launcher; absent when run by hand)
#   "since_s"  the seconds since the rank's previous record (the first: since its files were opened), so that the
#              records split the process's time between them: a step row the time of that step and of what ran
#              between it and the record before, an evaluation row the evaluation's, a checkpoint_saved the save's
SINCE = "since_s"
ATTEMPT = "attempt"


def event(kind: str, rank: int, **fields: Any) -> dict[str, Any]:
    """One events.jsonl record: its kind, the wall time, the rank that wrote it, and the kind's own fields."""
    return {"event": kind, "time": time.time(), "rank": rank, **fields}


@dataclass(frozen=True)
class StepMetrics:
    """One training step as metrics.jsonl records it (rank 0 writes it; ``loss`` is the mean over the world).

    ``memory`` holds this rank's bytes (params_bytes, grads_bytes, optimizer_bytes, activations_bytes,
    max_allocated_bytes) and, on the first step of a multi-rank job, ``per_rank``: every rank's. ``routing`` holds
    the mixture-of-experts figures (aux_loss, expert_load, dropped_fraction), written as top-level keys. ``ranks``
    holds, in a multi-rank job, the step's ``RANK_FIGURES`` of every rank as lists in rank order (left out for a
    world of one, whose figures are the row's own). ``time``: when the row was made, in seconds since the epoch.
    """

    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    step_time_s: float
    tokens_seen: int
    flops_per_step: int
    loss_scale: float
    skipped: bool
    mfu: float
    memory: dict[str, Any]
    routing: dict[str, Any] = field(default_factory=dict)
    ranks: dict[str, list[float]] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {**{k: v for k, v in out.items() if k != "routing" and (k != "ranks" or v)}, **self.routing}


# Each rank's own figures of a step, gathered into StepMetrics.ranks: the slowest rank sets the pace of all.
# compute_s: the rank's own forward and backward, before it waited for the others (null where not measured: see
# trainer/engine/stragglers.py); step times are alike on every rank, since each step ends in the same collectives.
RANK_FIGURES = ("step_time_s", "tokens_per_s", "max_allocated_bytes", "compute_s")


@dataclass(frozen=True)
class EvalMetrics:
    """An evaluation's row: the validation loss, and for a blend each source's (by name), val_loss then being their
    mean by weight."""

    step: int
    val_loss: float
    val_loss_by_source: Optional[dict[str, float]] = None

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        if self.val_loss_by_source is None:
            del row["val_loss_by_source"]
        return row


def is_step_row(record: dict[str, Any]) -> bool:
    """A metrics.jsonl record of a training step (not an evaluation)."""
    return "loss" in record and isinstance(record.get("step"), int)


def is_eval_row(record: dict[str, Any]) -> bool:
    return "val_loss" in record and isinstance(record.get("step"), int)


def last_step_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The training-step rows, one per step in step order: the last record of each (a resumed attempt redoes the
    steps after its checkpoint, and its records supersede the earlier ones)."""
    rows = {r["step"]: r for r in records if is_step_row(r)}
    return [rows[step] for step in sorted(rows)]


def step_times(records: list[dict[str, Any]], after_step: int = 0) -> list[float]:
    """step_time_s of the training steps numbered above ``after_step`` (the first ones pay for start-up)."""
    return [float(r["step_time_s"]) for r in last_step_rows(records) if "step_time_s" in r and r["step"] > after_step]


@dataclass(frozen=True)
class LaunchRecord:
    """launch.json: how the current attempt of a run was started (rewritten by every attempt)."""

    backend: str                  # the cluster kind: "local", "slurm", …
    job_id: str
    attempt: int
    resume: bool
    command: list[str]            # what was started (or the script's path, for a batch system)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, run_dir: str | Path) -> None:
        write_json_atomic(Path(run_dir) / LAUNCH, self.to_dict())

    @classmethod
    def read(cls, run_dir: str | Path) -> "LaunchRecord | None":
        data = read_json(Path(run_dir) / LAUNCH)
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{k: data[k] for k in ("backend", "job_id", "attempt", "resume", "command", "time")})
        except KeyError:
            return None


class Phase:
    """What a rank is doing, as its heartbeat says. Only a step waits on the other ranks for as long as it takes:
    starting (meeting, building, loading), evaluating and saving a checkpoint may rightly take far longer."""

    STARTING, STEP, EVALUATING, SAVING, DONE = "starting", "step", "evaluating", "saving", "done"


@dataclass(frozen=True)
class Heartbeat:
    """heartbeats/rank-<r>.json: a rank's sign of life, rewritten every ``every_s`` seconds by a thread of its own.

    The thread goes on beating while the rank waits inside a collective, and stops when the process is frozen,
    killed or its node lost; ``step``, ``phase`` and ``phase_since`` say how far training got and since when. A
    watcher outside the job tells a hung collective from a slow step with them (workers.hangs)."""

    rank: int
    world_size: int
    host: str
    pid: int
    process_started: float   # when the process began: a beat left by an earlier attempt is older than its start
    step: int                # steps done
    phase: str               # a ``Phase``
    phase_since: float       # when the phase began; in a step, when the step began
    median_step_s: float | None   # this rank's recent steps, None before the first
    every_s: float
    time: float = field(default_factory=time.time)

    def write(self, run_dir: str | Path) -> None:
        write_json_atomic(Path(run_dir) / HEARTBEATS / f"rank-{self.rank}.json", asdict(self), durable=False)

    @classmethod
    def read_all(cls, run_dir: str | Path) -> list["Heartbeat"]:
        """Every rank's newest beat found in the folder, in rank order; unreadable files are left out."""
        beats = []
        for path in sorted(Path(run_dir, HEARTBEATS).glob("rank-*.json")):
            data = read_json(path)
            try:
                beats.append(cls(**data))
            except TypeError:  # not a dict, or not this record's fields
                continue
        return sorted(beats, key=lambda b: b.rank)


@dataclass(frozen=True)
class Skip:
    """A loss spike at step ``spike_step`` sent the run back to its checkpoint of step ``after_step``, and the
    batches of steps after_step + 1 … spike_step were skipped: from there on, step n trains on the batch that step
    n + (spike_step − after_step) would have drawn, on top of the earlier skips."""

    after_step: int
    spike_step: int
    loss: Optional[float] = None    # the spike's loss (None: not finite)
    median: Optional[float] = None  # the median loss of the steps before it that it was judged against

    @property
    def batches(self) -> int:
        return self.spike_step - self.after_step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def read_all(run_dir: str | Path) -> list["Skip"]:
        data = read_json(Path(run_dir) / SKIPPED_BATCHES)
        fields = ("after_step", "spike_step", "loss", "median")
        return [Skip(**{k: item.get(k) for k in fields}) for item in (data or [])
                if isinstance(item, dict) and isinstance(item.get("after_step"), int)
                and isinstance(item.get("spike_step"), int)]

    @staticmethod
    def write_all(run_dir: str | Path, skips: list["Skip"]) -> None:
        write_json_atomic(Path(run_dir) / SKIPPED_BATCHES, [s.to_dict() for s in skips])
