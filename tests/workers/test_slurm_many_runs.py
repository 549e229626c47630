"""Fifty runs submitted at once through the API onto the test Slurm cluster: every one reaches the terminal state it
should, none is lost or submitted twice, and every reconcile pass asks Slurm once for all of them."""
import time
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from tests.webapp.conftest import client_for
from trainer.contract import ParallelPlan, presets
from webapp import models

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.once]

RUNS, DOOMED = 50, 5  # the doomed ones train on a text too short to split: they must fail, not hang or vanish


def test_fifty_runs_at_once_all_end_as_they_should_with_one_job_each_and_one_squeue_a_pass(
        broker, tiny_run_parts, slurm_cluster):
    owner, local_plan, dataset = tiny_run_parts
    short = Path(dataset.path).with_name("short.txt")
    short.write_text("too short to train on\n")
    doomed_data = models.Dataset.objects.create(owner=owner, name="short", path=str(short))
    cluster = models.Cluster.objects.create(
        name="slurm-1", kind="slurm", spec=presets.local_cpu_cluster(1).to_dict(), partition=slurm_cluster.partition)
    plan = models.ParallelismPlan.objects.create(owner=owner, name="one-rank", model_config=local_plan.model_config,
                                                 cluster=cluster,
                                                 spec=ParallelPlan(micro_batch=2, global_batch=2).to_dict())
    Token.objects.get_or_create(user=owner)
    owner.refresh_from_db()
    client = client_for(owner)
    ids = []
    for i in range(RUNS):
        body = {"name": f"many-{i}", "plan": plan.pk, "dataset": (doomed_data if i < DOOMED else dataset).pk,
                "steps": 2, "max_restarts": 0, "launch": True}
        response = client.post("/api/runs/", body, format="json")
        assert response.status_code == 201, response.json()
        ids.append(response.json()["id"])

    passes, deadline = [], time.monotonic() + 400
    while time.monotonic() < deadline:
        passes.append(broker.send_task("workbench.runs.reconcile").get(timeout=120))
        runs = list(models.Run.objects.filter(pk__in=ids))  # afresh: a queryset would answer from its cache
        if all(r.is_finished and r.ingest_state.get("job_ended") for r in runs):
            break
        time.sleep(1)
    statuses = {r.pk: r.status for r in runs}
    expected = {pk: "failed" if i < DOOMED else "completed" for i, pk in enumerate(ids)}
    assert statuses == expected, {pk: s for pk, s in statuses.items() if s != expected[pk]}

    squeue_calls = [p["scheduler_calls"].get("slurm", 0) for p in passes if p["runs"]]
    assert squeue_calls and set(squeue_calls) == {1}, squeue_calls
    for run in runs:
        assert run.attempts == 1 and run.attempt_records.count() == 1
        named = slurm_cluster.run(["squeue", "--noheader", "--states=all", f"--name=wb-run{run.pk}-a1",
                                   "--format=%i"]).stdout.split()
        assert named == [run.job_id], (run.pk, named)
    assert all(models.Metric.objects.filter(run_id=pk, kind="train").count() == 2 for pk in ids[DOOMED:])
