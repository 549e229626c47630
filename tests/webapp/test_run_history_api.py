"""A run's events and attempts over REST, and long polling: at once when something is newer, a bounded wait
otherwise."""
import time

import pytest

from tests.webapp.live_runs import append_metrics, new_run, step_record
from webapp import models
from webapp.services.history import Source, attempt_started, record_event


@pytest.fixture
def run(alice, plan222, corpus):
    return new_run(alice, plan222, corpus)


def test_it_lists_events_oldest_first_and_only_the_newer_ones_after_an_id(alice, bob, api, run):
    first = record_event(run, Source.WORKBENCH, "queued", "queued by alice")
    second = record_event(run, Source.TRAINER, "started", "started at step 0", step=0)
    third = record_event(run, Source.SCHEDULER, "running", "job 12 is running")
    everything = api(alice).get(f"/api/runs/{run.id}/events/").json()
    assert [e["id"] for e in everything["results"]] == [first.id, second.id, third.id]
    newer = api(alice).get(f"/api/runs/{run.id}/events/", {"after": first.id}).json()["results"]
    assert [(e["kind"], e["source"], e["data"]) for e in newer] == [("started", "trainer", {"step": 0}),
                                                                     ("running", "scheduler", {})]
    assert api(alice).get(f"/api/runs/{run.id}/events/", {"after": third.id}).json()["results"] == []
    assert api(bob).get(f"/api/runs/{run.id}/events/").status_code == 404


def test_it_lists_the_runs_attempts(alice, bob, api, run):
    run.attempts = 1
    attempt_started(run, "local", "123", resume=False, why="launched")
    run.attempts = 2
    attempt_started(run, "local", "456", resume=True, why="restart after a failure")
    attempts = api(alice).get(f"/api/runs/{run.id}/attempts/").json()["results"]
    assert [(a["number"], a["job_id"], a["resume"]) for a in attempts] == [(1, "123", False), (2, "456", True)]
    assert api(bob).get(f"/api/runs/{run.id}/attempts/").status_code == 404


def _updates(api, user, run, **params):
    started = time.monotonic()
    response = api(user).get(f"/api/runs/{run.id}/updates/", params)
    return response, time.monotonic() - started


def test_long_polling_answers_at_once_when_something_is_newer(alice, api, run):
    event = record_event(run, Source.WORKBENCH, "queued", "queued by alice")
    append_metrics(run, [step_record(s, 3.0) for s in (1, 2, 3)])
    response, took = _updates(api, alice, run, after_event=event.id - 1, after_step=3, wait=10)
    answer = response.json()
    assert answer["changed"] and [e["id"] for e in answer["events"]] == [event.id] and took < 2
    response, took = _updates(api, alice, run, after_event=event.id, after_step=1, wait=10)
    assert response.json()["latest_step"]["loss"] == 3.0 and response.json()["last_step"] == 3 and took < 2
    response, took = _updates(api, alice, run, after_event=event.id, after_step=3, status="running", wait=10)
    assert response.json()["status"] == "draft" and took < 2


def test_long_polling_waits_the_time_asked_when_nothing_is_newer_and_no_more(alice, bob, api, run):
    event = record_event(run, Source.WORKBENCH, "queued", "queued by alice")
    response, took = _updates(api, alice, run, after_event=event.id, after_step=0, status="draft", wait=1)
    answer = response.json()
    assert response.status_code == 200 and not answer["changed"] and answer["events"] == []
    assert 1.0 <= took < 3 and answer["waited_s"] >= 1.0
    assert _updates(api, alice, run, wait=31)[0].status_code == 400  # a wait is bounded
    assert _updates(api, bob, run, wait=1)[0].status_code == 404


def test_long_polling_answers_404_when_the_run_is_deleted_during_the_wait(alice, api, run, monkeypatch):
    from webapp.selectors import run_updates

    looks = []
    real_look = run_updates._look

    def look_then_delete(*args):  # the run goes between the first look and the next
        answer = real_look(*args)
        if not looks:
            models.Run.objects.filter(pk=run.pk).delete()
        looks.append(answer)
        return answer

    monkeypatch.setattr(run_updates, "_look", look_then_delete)
    monkeypatch.setattr(run_updates, "POLL_S", 0.05)
    response, _ = _updates(api, alice, run, after_step=0, status="draft", wait=5)
    assert response.status_code == 404 and f"run {run.pk} no longer exists" in response.json()["detail"]
