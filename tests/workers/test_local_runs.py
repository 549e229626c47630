"""Runs launched for real: the web side queues, a Celery worker starts torchrun, reconcile ingests the run folder.

These use the real worker, Redis, database and trainer (one CPU process a run, a tiny model), so they are few.
"""
import json
from pathlib import Path

import pytest

from tests.workers.conftest import reconcile_until
from trainer.contract.records import LaunchRecord
from webapp import models, services

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_it_trains_a_queued_run_to_completion_and_ingests_what_it_wrote(broker, tiny_run_parts):
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="e2e", plan=plan, dataset=dataset, steps=6, checkpoint_every=3,
                              eval_every=3, launch=True)
    run = reconcile_until(broker, run.pk, lambda r: r.is_finished)
    assert run.status == "completed", run.status_message
    assert run.attempts == 1 and run.last_step == 6 and run.started_at and run.finished_at
    folder = Path(run.run_dir)
    assert json.loads((folder / "spec.json").read_text()) == run.spec
    launch = LaunchRecord.read(folder)
    assert launch.job_id == run.job_id and launch.attempt == 1 and not launch.resume
    train = list(run.metrics.filter(kind="train").order_by("step").values_list("step", flat=True))
    assert train == [1, 2, 3, 4, 5, 6]
    assert run.metrics.filter(kind="val").count() == 2
    assert sorted(run.checkpoints.values_list("step", flat=True)) == [3, 6]
    assert run.checkpoints.get(step=6).manifest["step"] == 6


def test_it_retries_a_failing_run_until_its_attempts_are_used(broker, tiny_run_parts, tmp_path):
    owner, plan, dataset = tiny_run_parts
    Path(dataset.path).write_text("too short to train on\n")
    run = services.run_create(owner=owner, name="doomed", plan=plan, dataset=dataset, steps=3, max_restarts=1,
                              launch=True)
    run = reconcile_until(broker, run.pk, lambda r: r.status == "failed" and r.attempts == 2
                           and r.ingest_state.get("job_ended"))
    assert "attempt 2" in run.status_message and run.metrics.count() == 0


def test_it_stops_a_cancelled_run_which_saves_a_checkpoint_on_the_way_out(broker, tiny_run_parts):
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="long", plan=plan, dataset=dataset, steps=100_000, launch=True)
    reconcile_until(broker, run.pk, lambda r: r.status == "running" and r.last_step >= 2)
    services.run_cancel(run, "enough")
    run = reconcile_until(broker, run.pk, lambda r: r.ingest_state.get("job_ended"))
    assert run.status == "cancelled" and run.status_message == "enough"
    assert run.checkpoints.exists() and run.last_step < 100_000
    assert run.ingest_state["last_event"] == "stopped"
