"""Goodput: how much of the time a run held its nodes advanced its training, and where the rest went.

Pure functions, no database: ``ledger_add`` folds each record of the run folder into a small per-attempt ledger as
ingestion reads it (kept in ``Run.ingest_state``), and ``account`` splits each attempt's allocation into parts.

What is measured, and by whom:

- the allocation: from the job's own record of its start on its nodes to its record of its end (jobs.jsonl, written
  by the batch script or the local supervisor); a job that died without one (its node was lost) ends when the
  workbench saw it end;
- before it, the queue: from the submission to that start (not allocated time, shown beside it);
- start-up: from the allocation's start to the trainer's ``started`` event, less the checkpoint's load time (which
  the trainer measures and says in that event);
- after it, every record rank 0 writes carries the seconds since its previous record (records.SINCE): a step row
  the step's, an evaluation row the evaluation's, a checkpoint_saved the save's; any other record's is "other";
- the tail: from the attempt's last record to the end of its allocation, lost to whatever ended it (a node failure,
  a hang, a preemption, a failure) or, for an attempt that ended as it should, its shut-down.

Steps are kept or redone: the steps an attempt ran past the checkpoint the next attempt resumed from were done
again, so their time is "redone", not training; so were the steps a loss spike sent the run back over (the step
rows go back), "lost to loss spikes". Goodput is the kept steps' share of the allocated time. The parts
are measured separately (three clocks: the job's, the trainer's wall clock, its step timer), so their sum is checked
against the allocation, not made to match it: what does not add up is shown as "unaccounted".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainer.contract.records import ATTEMPT, SINCE, Event, is_eval_row, is_step_row

# The parts, in the order they are shown, and the words for them
PARTS = {
    "training": "training (steps kept)",
    "startup": "start-up",
    "checkpoint_load": "checkpoint load",
    "checkpoint_save": "checkpoint save",
    "evaluation": "evaluation",
    "redone": "steps redone",
    "other": "other",
    "shutdown": "shut-down",
    "running": "in the current step",
    "lost_node_failure": "lost to a node failure",
    "lost_hang": "lost to a hung collective",
    "lost_preemption": "lost to preemption",
    "lost_time_limit": "lost to the time limit",
    "lost_failure": "lost to a failure",
    "lost_cancelled": "lost to a cancel",
    "lost_loss_spike": "lost to loss spikes (steps rolled back)",
    "unaccounted": "unaccounted",
}


def ledger_add(ledger: dict[str, dict], record: dict[str, Any], checkpoint_every: int, attempt: int) -> None:
    """Fold one record of jobs.jsonl, events.jsonl or metrics.jsonl into ``ledger`` (attempt number → its sums).
    ``attempt``: the run's current attempt, for a record that does not say its own (written by hand)."""
    number = record.get(ATTEMPT)
    number = number if isinstance(number, int) and number > 0 else attempt
    entry = ledger.setdefault(str(number), {})
    at, kind = _number(record.get("time")), record.get("event")
    if kind == Event.JOB_STARTED:
        entry["job_started"] = at
        return
    if kind == Event.JOB_ENDED:
        entry["job_ended"] = at
        return
    if record.get("rank", 0) != 0:
        return  # another rank's failure report: its own clock, and rank 0 reports the time
    if kind == Event.STARTED:
        entry.update(started=at, load_s=_number(record.get("load_s")) or 0.0, resumed_at=record.get("step") or 0)
        entry["last"] = max(entry.get("last") or 0.0, at or 0.0)
        return
    since = _number(record.get(SINCE))
    step_or_eval = is_step_row(record) or is_eval_row(record)
    # An event before the trainer's started (events.jsonl is read in order) is part of the start-up, measured from
    # the times; metrics rows all come after it, though ingestion may read them before it reads the event.
    if since is None or not (step_or_eval or "started" in entry):
        return
    if is_step_row(record):
        _step_row(entry, record["step"], since, checkpoint_every)
        part = None
    elif is_eval_row(record):
        part = "evaluation"
    elif kind == Event.CHECKPOINT_SAVED:
        part = "checkpoint_save"
    else:
        part = "other"
    if part:
        entry[part] = entry.get(part, 0.0) + since
    entry["last"] = max(entry.get("last") or 0.0, at or 0.0)


def _step_row(entry: dict, step: int, since: float, checkpoint_every: int) -> None:
    """A step's seconds. ``steps_s_at``: the attempt's step seconds so far at each step it may go back to (its
    start, its checkpoints), for the steps a rollback or a later attempt's resume sets aside."""
    at = entry.setdefault("steps_s_at", {})
    if not at:
        at[str(step - 1)] = 0.0  # where the attempt started
    elif step <= entry.get("last_step", step):  # it went back to a checkpoint after a loss spike
        back = at.get(str(step - 1), 0.0)
        entry["lost_loss_spike"] = entry.get("lost_loss_spike", 0.0) + entry.get("steps_s", 0.0) - back
        entry["steps_s"] = back
        entry["steps_s_at"] = at = {s: seconds for s, seconds in at.items() if int(s) < step}
    entry["steps_s"] = entry.get("steps_s", 0.0) + since
    entry["last_step"] = step
    if checkpoint_every and step % checkpoint_every == 0:
        at[str(step)] = entry["steps_s"]


@dataclass(frozen=True)
class AttemptTimes:
    """What the database knows of an attempt: when it was submitted and ended, and how it ended ("completed",
    "running", or a cause of PARTS' lost_<cause>)."""

    number: int
    submitted: float
    ended: float | None
    ending: str


@dataclass(frozen=True)
class Goodput:
    gpus: int
    allocated_s: float          # wall seconds the run's attempts held their nodes (× gpus: GPU seconds)
    queue_s: float              # wall seconds its attempts waited to start
    parts: dict[str, float]     # PARTS → wall seconds, summing to allocated_s but for what is unaccounted

    @property
    def share(self) -> float | None:
        """The kept steps' share of the allocated time."""
        return self.parts.get("training", 0.0) / self.allocated_s if self.allocated_s > 0 else None

    @classmethod
    def total(cls, runs: list["Goodput"]) -> "Goodput | None":
        """Several runs' goodput together, in GPU seconds (``gpus`` 1); None when none held nodes."""
        if not any(g.allocated_s > 0 for g in runs):
            return None
        parts: dict[str, float] = {}
        for g in runs:
            for name, seconds in g.parts.items():
                _add(parts, name, seconds * g.gpus)
        return cls(gpus=1, allocated_s=sum(g.allocated_s * g.gpus for g in runs),
                   queue_s=sum(g.queue_s * g.gpus for g in runs),
                   parts={name: parts[name] for name in PARTS if name in parts})

    def to_dict(self) -> dict[str, Any]:
        return {"goodput": self.share, "gpus": self.gpus, "allocated_s": self.allocated_s,
                "allocated_gpu_hours": self.allocated_s * self.gpus / 3600, "queue_s": self.queue_s,
                "parts": [{"name": name, "label": PARTS[name], "seconds": seconds,
                           "share": seconds / self.allocated_s if self.allocated_s > 0 else None}
                          for name, seconds in self.parts.items()]}


def account(ledger: dict[str, dict], attempts: list[AttemptTimes], gpus: int, now: float) -> Goodput:
    """Split each attempt's allocation into PARTS (see the module's docstring) and add them up over the run."""
    parts: dict[str, float] = {}
    allocated = queue = 0.0
    ordered = sorted(attempts, key=lambda a: a.number)
    for i, attempt in enumerate(ordered):
        entry = ledger.get(str(attempt.number), {})
        start = entry.get("job_started")
        end = entry.get("job_ended") or attempt.ended or now
        if start is None:  # never began on its nodes (or began before jobs recorded their start): all queue
            queue += max(0.0, end - attempt.submitted)
            continue
        allocated += end - start
        queue += max(0.0, start - attempt.submitted)
        if "started" not in entry:  # ended while starting
            _add(parts, "startup" if attempt.ending in ("running", "completed") else f"lost_{attempt.ending}",
                 end - start)
            continue
        load = entry.get("load_s", 0.0)
        _add(parts, "startup", entry["started"] - start - load)
        _add(parts, "checkpoint_load", load)
        kept = _kept_steps_s(entry, _next_resume(ledger, ordered[i + 1:]))
        _add(parts, "training", kept)
        _add(parts, "redone", entry.get("steps_s", 0.0) - kept)
        for part in ("evaluation", "checkpoint_save", "other", "lost_loss_spike"):
            _add(parts, part, entry.get(part, 0.0))
        tail = "shutdown" if attempt.ending == "completed" else \
            "running" if attempt.ending == "running" else f"lost_{attempt.ending}"
        _add(parts, tail, end - entry.get("last", entry["started"]))
    parts = {name: parts[name] for name in PARTS if parts.get(name)}
    unaccounted = allocated - sum(parts.values())
    if abs(unaccounted) > 1e-6:
        parts["unaccounted"] = unaccounted
    return Goodput(gpus=gpus, allocated_s=allocated, queue_s=queue, parts=parts)


def _next_resume(ledger: dict[str, dict], later: list[AttemptTimes]) -> int | None:
    """The step the next attempt that started training resumed from (None: none did, so far)."""
    for attempt in later:
        entry = ledger.get(str(attempt.number), {})
        if "started" in entry:
            return entry.get("resumed_at", 0)
    return None


def _kept_steps_s(entry: dict, resumed_at: int | None) -> float:
    """The step seconds of an attempt that a later attempt did not redo: all of them, unless one resumed before
    this attempt's last step; then those up to where it resumed (a checkpoint this attempt saved, or none)."""
    total = entry.get("steps_s", 0.0)
    if resumed_at is None or resumed_at >= entry.get("last_step", 0):
        return total
    return entry.get("steps_s_at", {}).get(str(resumed_at), 0.0)


def _add(parts: dict[str, float], name: str, seconds: float) -> None:
    parts[name] = parts.get(name, 0.0) + seconds


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def timestamp(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment else None
