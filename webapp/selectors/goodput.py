"""Goodput of a run and of a cluster's runs (webapp.goodput does the arithmetic): from each run's ledger, kept by
ingestion, and its attempts, with how each ended."""
from __future__ import annotations

import time

from django.db.models import Prefetch, QuerySet

from trainer.contract import ParallelPlan

from ..goodput import AttemptTimes, Goodput, account, timestamp
from ..models import Attempt, Cluster, Run

# The next attempt's reason (the words of workers.runs' settling) → what ended this one
_REQUEUED_AFTER = (("hung collective", "hang"), ("node failure", "node_failure"), ("preemption", "preemption"),
                   ("time limit", "time_limit"))
# The scheduler's state of an attempt that ended → what ended it, when the next attempt does not say
_STATES = {"COMPLETED": "completed", "NODE_FAIL": "node_failure", "PREEMPTED": "preemption",
           "TIMEOUT": "time_limit", "CANCELLED": "cancelled"}


def _ending(attempt: Attempt, following: Attempt | None) -> str:
    if attempt.ended_at is None:
        return "running"
    why = following.why if following else ""
    return next((cause for words, cause in _REQUEUED_AFTER if words in why), None) or \
        _STATES.get(attempt.state, "failure")


def _world_size(run: Run) -> int:
    """The run's GPUs, from its stored plan alone: checking the whole spec, for every run of a cluster on every
    dashboard, took most of the page's time with a few hundred runs."""
    try:
        return ParallelPlan.from_dict(run.spec["plan"], validate=False).world_size if run.spec else 1
    except (TypeError, ValueError, KeyError):
        return 1


def goodput_of(run: Run, now: float | None = None) -> Goodput:
    """``run`` with its attempts prefetched or not."""
    attempts = sorted(run.attempt_records.all(), key=lambda a: a.number)
    times = [AttemptTimes(number=a.number, submitted=a.submitted_at.timestamp(), ended=timestamp(a.ended_at),
                          ending=_ending(a, attempts[i + 1] if i + 1 < len(attempts) else None))
             for i, a in enumerate(attempts)]
    return account((run.ingest_state or {}).get("ledger", {}), times, _world_size(run),
                   time.time() if now is None else now)


def _with_attempts(runs: QuerySet) -> QuerySet:
    return runs.prefetch_related(Prefetch("attempt_records", queryset=Attempt.objects.order_by("number")))


def clusters_goodput(clusters: list[Cluster]) -> dict[int, Goodput]:
    """The goodput of each of ``clusters`` whose runs held nodes, by id: all their runs together, in GPU seconds
    (a run's parts times its GPUs). One query for the runs, one for their attempts."""
    now, by_cluster = time.time(), {}
    for run in _with_attempts(Run.objects.filter(cluster__in=clusters, attempts__gt=0)):
        by_cluster.setdefault(run.cluster_id, []).append(goodput_of(run, now))
    return {pk: total for pk, runs in by_cluster.items() if (total := Goodput.total(runs)) is not None}
