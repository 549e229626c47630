"""Reading run folders in, off the reconcile pass: reconcile only notices which folders have grown and hands them to
ingest tasks, a chunk of runs each, which any worker may take, so that a pass over many active runs stays short
and ingestion spreads over the workers.

A run waiting for ingestion is marked in Redis (SET NX with an expiry) so that a slow ingest is not asked for again
by every pass meanwhile. The mark is only a hint: the truth is the offsets kept on the run, so a lost mark (Redis
restarted) costs at most one ingest too many, and an expired one a run read twice, which changes nothing.
"""
import logging
from functools import lru_cache

import redis
from django.conf import settings

from webapp.services.tasks import TaskName, enqueue
from webapp.services.ingest import run_ingest

RUNS_PER_TASK = 25
PENDING_TTL_S = 120  # a mark left by a worker that died mid-ingest lapses, and the run is asked for again

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def _mark(run_id: int) -> str:
    return f"workbench:ingest-pending:{run_id}"


def request_ingest(run_ids: list[int]) -> int:
    """Send ingest tasks for the runs not already waiting for one; how many runs were sent."""
    if not run_ids:
        return 0
    try:
        pipe = _redis().pipeline(transaction=False)
        for run_id in run_ids:
            pipe.set(_mark(run_id), 1, nx=True, ex=PENDING_TTL_S)
        fresh = [run_id for run_id, marked in zip(run_ids, pipe.execute()) if marked]
    except redis.RedisError as exc:  # no marks this time: ask for all of them
        log.warning("ingest marks unavailable (%s): asking for every grown folder", exc)
        fresh = list(run_ids)
    for start in range(0, len(fresh), RUNS_PER_TASK):
        enqueue(TaskName.RUNS_INGEST, fresh[start:start + RUNS_PER_TASK])
    return len(fresh)


def ingest_runs(run_ids: list[int]) -> int:
    """Read each run's folder in; the marks go first, so that lines written meanwhile are asked for again."""
    try:
        _redis().delete(*[_mark(run_id) for run_id in run_ids])
    except redis.RedisError as exc:
        log.warning("could not clear ingest marks: %s", exc)
    done = 0
    for run_id in run_ids:
        try:
            run_ingest(run_id)
            done += 1
        except Exception:  # one broken run folder must not stop the others from being read
            log.exception("ingesting run %s failed", run_id)
    return done
