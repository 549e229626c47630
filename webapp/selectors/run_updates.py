"""Long polling for a run's live view: answer at once when something is newer than what the client has, otherwise
look again every POLL_S seconds until something is or ``wait`` runs out.

Why long polling and not server-sent events: it is plain request and answer, so it passes every proxy, works with
the test client, the development server and any gunicorn worker class, documents itself in the OpenAPI schema and
needs no connection kept open beyond one bounded wait; a client that loses the connection just asks again with the
same cursors. Events would save a round trip per update, which at one update every few seconds (the workers'
reconcile period) buys nothing.

Cost: a waiting request holds one worker thread for up to ``wait`` seconds (MAX_WAIT_S at most) and runs two
indexed single-row queries every POLL_S seconds, outside any transaction (webapp.api.live): no lock is held and
each look sees what the workers committed. Serve with threads to spare (gunicorn ``--worker-class gthread
--threads N``: N clients waiting at once take N threads); a finished run answers at once, as nothing more will come.
"""
from __future__ import annotations

import time

from ..models import FINISHED, Run, RunEvent, SeriesStep
from ..models.series import SERIES_BY_NAME

POLL_S = 1.0
MAX_WAIT_S = 30.0
MAX_EVENTS = 100


class RunGone(Exception):
    """The run was deleted while a client waited on it."""


def run_updates(run: Run, after_event: int | None, after_step: int | None, status: str | None,
                wait: float) -> dict:
    """What is newer than the cursors (a cursor not given counts as knowing nothing), waiting for it up to
    ``wait`` seconds (bounded by MAX_WAIT_S)."""
    started = time.monotonic()
    deadline = started + max(0.0, min(wait, MAX_WAIT_S))
    while True:
        answer = _look(run.pk, after_event, after_step, status)
        now = time.monotonic()
        if answer["changed"] or answer["finished"] or now >= deadline:
            answer["waited_s"] = round(now - started, 3)
            return answer
        time.sleep(min(POLL_S, deadline - now))


def _look(run_id: int, after_event: int | None, after_step: int | None, status: str | None) -> dict:
    current = Run.objects.filter(pk=run_id).values("status", "status_message", "last_step").first()
    if current is None:
        raise RunGone(f"run {run_id} no longer exists")
    events = list(RunEvent.objects.filter(run_id=run_id, id__gt=after_event or 0).order_by("id")[:MAX_EVENTS + 1])
    new_steps = current["last_step"] > after_step if after_step is not None else True
    changed = bool(events) or new_steps or (status is not None and status != current["status"])
    return {"changed": changed, "finished": current["status"] in FINISHED, **current,
            "events": events[:MAX_EVENTS], "more_events": len(events) > MAX_EVENTS,
            "latest_step": _latest_step(run_id, current["last_step"]) if new_steps else None}


def _latest_step(run_id: int, step: int) -> dict | None:
    """The figures of the run's newest step, for a live view to show without asking for a chart."""
    return (SeriesStep.objects.filter(run_id=run_id, step=step)
            .values("step", "tokens_seen", "wall_time", *SERIES_BY_NAME).first())
