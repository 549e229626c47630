"""Goodput of a run and of a cluster's runs (webapp.goodput does the arithmetic): from each run's ledger, kept by
ingestion, and its attempts, with how each ended."""
from __future__ import annotations

import time
from collections import defaultdict

from trainer.contract import ParallelPlan

from ..goodput import AttemptTimes, Goodput, account, timestamp
from ..models import Attempt, Cluster, Run

# The next attempt's reason (the words of workers.runs' settling) → what ended this one
_REQUEUED_AFTER = (("hung collective", "hang"), ("node failure", "node_failure"), ("preemption", "preemption"),
                   ("time limit", "time_limit"))
# The scheduler's state of an attempt that ended → what ended it, when the next attempt does not say
_STATES = {"COMPLETED": "completed", "NODE_FAIL": "node_failure", "PREEMPTED": "preemption",
           "TIMEOUT": "time_limit", "CANCELLED": "cancelled"}


# What goodput reads of an attempt: not its batch script or command, a few kilobytes each
_ATTEMPT_FIELDS = ("number", "submitted_at", "ended_at", "state", "why")


def _ending(attempt: dict, following: dict | None) -> str:
    if attempt["ended_at"] is None:
        return "running"
    why = following["why"] if following else ""
    return next((cause for words, cause in _REQUEUED_AFTER if words in why), None) or \
        _STATES.get(attempt["state"], "failure")


def _times(attempts: list[dict]) -> list[AttemptTimes]:
    """``attempts`` (_ATTEMPT_FIELDS of each) in the order of their numbers."""
    return [AttemptTimes(number=a["number"], submitted=a["submitted_at"].timestamp(), ended=timestamp(a["ended_at"]),
                         ending=_ending(a, attempts[i + 1] if i + 1 < len(attempts) else None))
            for i, a in enumerate(attempts)]


def _world_size(plan: dict | None) -> int:
    """The run's GPUs, from its stored plan alone (checking the whole spec took most of a dashboard's time)."""
    try:
        return ParallelPlan.from_dict(plan, validate=False).world_size if plan else 1
    except (TypeError, ValueError, KeyError):
        return 1


def goodput_of(run: Run, now: float | None = None) -> Goodput:
    attempts = list(Attempt.objects.filter(run=run).order_by("number").values(*_ATTEMPT_FIELDS))
    return account((run.ingest_state or {}).get("ledger", {}), _times(attempts),
                   _world_size((run.spec or {}).get("plan")), time.time() if now is None else now)


def clusters_goodput(clusters: list[Cluster]) -> dict[int, Goodput]:
    """The goodput of each of ``clusters`` whose runs held nodes, by id: all their runs together, in GPU seconds
    (a run's parts times its GPUs). One query for the runs, one for their attempts, each reading only the fields
    goodput needs: a run's ledger and plan, not its whole state, spec and estimate (tens of kilobytes a run, most
    of the dashboard's time with a few hundred runs)."""
    now = time.time()
    runs = list(Run.objects.filter(cluster__in=clusters, attempts__gt=0)
                .values_list("pk", "cluster_id", "spec__plan", "ingest_state__ledger"))
    attempts = defaultdict(list)
    for attempt in (Attempt.objects.filter(run__cluster__in=clusters, run__attempts__gt=0)
                    .order_by("run_id", "number").values("run_id", *_ATTEMPT_FIELDS)):
        attempts[attempt["run_id"]].append(attempt)
    by_cluster = defaultdict(list)
    for pk, cluster_id, plan, ledger in runs:
        by_cluster[cluster_id].append(account(ledger or {}, _times(attempts[pk]), _world_size(plan), now))
    return {pk: total for pk, found in by_cluster.items() if (total := Goodput.total(found)) is not None}
