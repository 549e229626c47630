"""Launching claims the run, starts its job with no transaction open, then records it; a repeated task starts nothing.

The launch task is delivered by the test itself (no broker, no worker) to the real local launcher, whose ``start`` is
wrapped to see the database while a job starts: what it starts is a real torchrun of the trainer, stopped afterwards.
"""
import json
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from trainer.contract.command import trainer_command
from trainer.contract.records import LaunchRecord
from webapp import services
from webapp.models import Run, RunStatus
from workers.launchers import Job, LocalLauncher
from workers.launching import CLAIM_MARGIN_S, run_launch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def spy_start(monkeypatch):
    """LocalLauncher.submit as it is, after running ``during`` hooks whose answers are kept with what it started."""
    real_submit, calls, during = LocalLauncher.submit, [], []

    def submit(self, request):
        seen = {"in_atomic_block": connection.in_atomic_block}
        for hook in during:
            seen.update(hook())
        started = real_submit(self, request)
        calls.append(SimpleNamespace(seen=seen, started=started, run_dir=request.run_dir))
        return started

    monkeypatch.setattr(LocalLauncher, "submit", submit)
    yield SimpleNamespace(calls=calls, during=during)
    for call in calls:  # no trainer outlives its test
        LocalLauncher().cancel(Job(call.started.job_id, call.run_dir))
        _wait_for(lambda: not LocalLauncher().poll([Job(call.started.job_id, call.run_dir)])[call.started.job_id].alive,
                  f"the job in {call.run_dir} to end")


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.2)


def _queued(owner, plan, dataset, **fields) -> Run:
    run = services.run_create(owner=owner, name="launch", plan=plan, dataset=dataset, steps=2, **fields)
    run.transition(RunStatus.QUEUED)  # without run_queue's message to a broker: the test delivers the task itself
    run.save()
    return run


def _row_lock_from_another_connection(run_id: int) -> dict:
    """Whether another connection can lock the run's row at once (a thread has a database connection of its own)."""
    answer = {}

    def lock():
        try:
            with transaction.atomic():
                Run.objects.select_for_update(nowait=True).get(pk=run_id)
            answer["other_connection_locked_the_row"] = True
        except DatabaseError as exc:
            answer["other_connection_locked_the_row"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=lock)
    thread.start()
    thread.join(timeout=30)
    return answer


def test_it_starts_the_job_with_no_transaction_open_and_the_row_unlocked(spy_start, tiny_run_parts):
    run = _queued(*tiny_run_parts)
    # SQLite has no row locks (select_for_update is a no-op there and nowait is not supported), so on SQLite only
    # the open transaction is checked; on PostgreSQL another connection must get the row's lock while start runs.
    if connection.vendor != "sqlite":
        spy_start.during.append(lambda: _row_lock_from_another_connection(run.pk))
    assert run_launch(run.pk) == "submitted"
    [call] = spy_start.calls
    assert call.seen["in_atomic_block"] is False
    if connection.vendor != "sqlite":
        assert call.seen["other_connection_locked_the_row"] is True
    run.refresh_from_db()
    assert (run.status, run.attempts, run.job_id, run.launching_since) == ("submitted", 1, call.started.job_id, None)
    assert call.started.command == trainer_command(["--spec", str(call.run_dir / "spec.json")], nproc_per_node=1)
    launch = LaunchRecord.read(call.run_dir)
    assert (launch.command, launch.job_id, launch.attempt, launch.resume) == (call.started.command, run.job_id, 1,
                                                                              False)


def test_it_starts_nothing_when_the_launch_task_is_delivered_again(spy_start, tiny_run_parts):
    run = _queued(*tiny_run_parts)
    spy_start.during.append(lambda: {"meanwhile": run_launch(run.pk)})  # delivered again while the job starts
    assert run_launch(run.pk) == "submitted"
    assert run_launch(run.pk) == "skipped: run is submitted"  # and once more after
    [call] = spy_start.calls
    assert call.seen["meanwhile"] == "skipped: another launch claimed the run and is submitting its job"
    assert Run.objects.get(pk=run.pk).attempts == 1


def test_it_takes_over_a_claim_left_by_a_worker_that_died_while_starting(spy_start, tiny_run_parts):
    run = _queued(*tiny_run_parts)
    stale = timezone.now() - timedelta(seconds=LocalLauncher.start_timeout_s + CLAIM_MARGIN_S + 1)
    Run.objects.filter(pk=run.pk).update(launching_since=stale)
    assert run_launch(run.pk) == "submitted" and len(spy_start.calls) == 1


def test_it_launches_with_the_stored_spec_when_the_plan_was_edited_after_creating_the_run(spy_start,
                                                                                           tiny_run_parts):
    owner, plan, dataset = tiny_run_parts
    run = _queued(owner, plan, dataset)
    plan.spec = {**plan.spec, "micro_batch": 1, "global_batch": 8}
    plan.full_clean()
    plan.save()
    assert run_launch(run.pk) == "submitted"
    [call] = spy_start.calls
    launched = json.loads((call.run_dir / "spec.json").read_text())
    assert launched == run.spec and (launched["plan"]["micro_batch"], launched["plan"]["global_batch"]) == (2, 4)


def test_it_stops_the_job_it_just_started_when_the_run_was_cancelled_meanwhile(spy_start, tiny_run_parts):
    run = _queued(*tiny_run_parts)
    spy_start.during.append(lambda: services.run_cancel(run, "changed my mind") and {})
    assert run_launch(run.pk) == "stopped the job just started: the run is cancelled"
    [call] = spy_start.calls
    run.refresh_from_db()
    assert (run.status, run.status_message, run.job_id) == ("cancelled", "changed my mind", call.started.job_id)
    assert run.launching_since is None and run.ingest_state["job_ended"] is False  # reconcile watches it end
    _wait_for(lambda: not LocalLauncher().poll([Job(run.job_id, call.run_dir)])[run.job_id].alive,
              "the stopped job to end")


def test_it_fails_a_run_whose_job_cannot_start_with_the_reason(spy_start, tiny_run_parts):
    owner, plan, dataset = tiny_run_parts
    plan.cluster.env_setup = ["module load cuda"]
    plan.cluster.save()
    run = _queued(owner, plan, dataset)
    assert run_launch(run.pk) == "failed" and spy_start.calls == []
    run.refresh_from_db()
    assert run.status == "failed" and run.launching_since is None
    assert run.status_message == "could not launch: environment setup lines apply to Slurm clusters; clear them on " \
                                 "a local cluster"
