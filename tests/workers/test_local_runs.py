"""Runs launched for real: the web side queues, a Celery worker starts torchrun, reconcile ingests the run folder.

These use the real worker, Redis, database and trainer (one CPU process a run, a tiny model), so they are few.
"""
import json
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from tests.webapp.conftest import client_for
from tests.worker_fixtures import reconcile_until
from trainer.contract import ParallelPlan, presets
from trainer.contract.records import LaunchRecord
from webapp import models, services
from webapp.selectors.goodput import goodput_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
# On SQLite too (the test command's second pass) the first run alone: the others check processes, not queries


def test_it_trains_a_queued_run_to_completion_and_ingests_what_it_wrote(broker, tiny_run_parts):
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="e2e", plan=plan, dataset=dataset, steps=6, checkpoint_every=3,
                              eval_every=3, launch=True)
    run = reconcile_until(broker, run.pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"))
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
    # every record says its attempt, and the time the job held this machine is accounted for
    assert {m.values["attempt"] for m in run.metrics.all()} == {1}
    goodput = goodput_of(run)
    measured = sum(seconds for name, seconds in goodput.parts.items() if name != "unaccounted")
    assert goodput.allocated_s > 0 and abs(measured - goodput.allocated_s) <= 0.01 * goodput.allocated_s, goodput
    assert set(goodput.parts) >= {"training", "startup", "evaluation", "checkpoint_save", "shutdown"}, goodput


@pytest.mark.once
def test_it_retries_a_failing_run_until_its_attempts_are_used(broker, tiny_run_parts, tmp_path):
    owner, plan, dataset = tiny_run_parts
    Path(dataset.path).write_text("too short to train on\n")
    run = services.run_create(owner=owner, name="doomed", plan=plan, dataset=dataset, steps=3, max_restarts=1,
                              launch=True)
    run = reconcile_until(broker, run.pk, lambda r: r.status == "failed" and r.attempts == 2
                           and r.ingest_state.get("job_ended"))
    assert "attempt 2" in run.status_message and run.metrics.count() == 0


@pytest.mark.once
def test_it_stops_a_cancelled_run_which_saves_a_checkpoint_on_the_way_out(broker, tiny_run_parts):
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="long", plan=plan, dataset=dataset, steps=100_000, launch=True)
    reconcile_until(broker, run.pk, lambda r: r.status == "running" and r.last_step >= 2)
    services.run_cancel(run, "enough")
    run = reconcile_until(broker, run.pk, lambda r: r.ingest_state.get("job_ended"))
    assert run.status == "cancelled" and run.status_message == "enough"
    assert run.checkpoints.exists() and run.last_step < 100_000
    assert run.ingest_state["last_event"] == "stopped"


@pytest.mark.once
def test_a_dp2_run_through_the_api_is_queued_runs_and_completes_with_all_it_wrote_readable(broker, tiny_run_parts):
    owner, one_rank, dataset = tiny_run_parts
    cluster = models.Cluster.objects.create(name="local-2", spec=presets.local_cpu_cluster(2).to_dict())
    plan = models.ParallelismPlan.objects.create(owner=owner, name="dp2", model_config=one_rank.model_config,
                                                 cluster=cluster,
                                                 spec=ParallelPlan(dp=2, micro_batch=2, global_batch=4).to_dict())
    Token.objects.get_or_create(user=owner)
    owner.refresh_from_db()
    client = client_for(owner)
    created = client.post("/api/runs/", {"name": "dp2", "plan": plan.pk, "dataset": dataset.pk, "steps": 6,
                                         "checkpoint_every": 3, "profile": {"start_step": 1, "steps": 2},
                                         "launch": True}, format="json")
    assert created.status_code == 201, created.json()
    run_id = created.json()["id"]
    assert created.json()["status"] == "queued"
    reconcile_until(broker, run_id, lambda r: r.is_finished and r.ingest_state.get("job_ended"))

    shown = client.get(f"/api/runs/{run_id}/").json()
    assert (shown["status"], shown["last_step"], shown["attempts"]) == ("completed", 6, 1), shown["status_message"]
    events = client.get(f"/api/runs/{run_id}/events/").json()["results"]
    said = [(e["source"], e["kind"]) for e in events if e["kind"] in ("queued", "submitted", "started", "finished")]
    assert said == [("workbench", "queued"), ("workbench", "submitted"), ("trainer", "started"),
                    ("trainer", "finished")]
    assert ("scheduler", "completed") in [(e["source"], e["kind"]) for e in events]
    series = client.get(f"/api/runs/{run_id}/series/?names=loss").json()["series"]["loss"]
    assert [x for x, _ in series["points"]] == [1, 2, 3, 4, 5, 6] and not series["downsampled"]
    logs = client.get(f"/api/runs/{run_id}/logs/?rank=1").json()
    assert "rank 1: finished at step 6" in logs["text"]
    [profile] = client.get(f"/api/profiles/?run={run_id}").json()["results"]
    assert profile["summary"], profile
    assert sorted(c["step"] for c in client.get(f"/api/checkpoints/?run={run_id}").json()["results"]) == [3, 6]
    ranks = client.get(f"/api/runs/{run_id}/ranks/").json()
    assert ranks["world_size"] == 2 and ranks["slowest_rank"] in (0, 1)
