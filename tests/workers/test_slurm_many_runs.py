"""Many runs submitted at once through the API onto the test Slurm cluster: every one reaches the terminal state it
should, none is lost or submitted twice, and every reconcile pass asks Slurm once for all of them. Meanwhile the pages
are timed, and their server times printed beside their target and beside the same pages' times before the load.
Reconcile passes come every PASS_EVERY_S, as beat sends them. The test cluster's nodes share the web's cores here,
where on a site they are machines of their own: as a benchmark, while the runs go, the nodes' processes have the
lowest CPU weight (``SlurmCluster.jobs_at_lowest_priority``). Not in the suite, where the other pytest-xdist worker's
tests would then leave the jobs next to no CPU.

Thirty runs in the suite: past the 25 completed runs where calibration's refit cross-validates and the
25 runs an ingest task takes. As a benchmark, with more runs and the figures shown (about 10 minutes for 200 here):

    WORKBENCH_MANY_RUNS=200 .venv/bin/pytest tests/workers/test_slurm_many_runs.py -s
"""
import contextlib
import os
import statistics
import time
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from tests.webapp.conftest import client_for
from trainer.contract import ParallelPlan, presets
from webapp import models
from workers.launchers import job_name, row_stamp

RUNS = int(os.environ.get("WORKBENCH_MANY_RUNS", "30"))
BENCHMARK = "WORKBENCH_MANY_RUNS" in os.environ
DOOMED = RUNS // 10  # these train on a text too short to split: they must fail, not hang or vanish
PAGE_TARGET_S = 0.300  # bench/webapp/pages.py's
PASS_EVERY_S = 5.0  # the beat schedule's (workers.celery_app)
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.once,
              pytest.mark.timeout(max(600, 6 * RUNS))]  # 200 runs: about 10 minutes here


def _server_time(client, url: str) -> tuple[float, float]:
    """The page's time in this process (view, queries, template; no network), as bench/webapp/pages.py times it:
    wall-clock and this process's CPU time."""
    wall, cpu = time.perf_counter(), time.process_time()
    answer = client.get(url)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert answer.status_code == 200, (url, answer.status_code)
    return wall, cpu


def _figures(before: dict[str, list], during: dict[str, list], pass_s: list[float], reports: list[dict]) -> str:
    def ms(times: list[float]) -> str:
        return f"{statistics.median(times) * 1e3:>6.0f} ms"

    lines = [f"{RUNS} runs at once on the test Slurm cluster: page server time, median, before the launch and "
             f"during it (target {PAGE_TARGET_S * 1e3:.0f} ms)",
             f"{'page':<24}{'wall before':>12}{'during':>10}{'ratio':>7}{'CPU before':>13}{'during':>10}{'ratio':>7}"]
    for name, times in during.items():
        idle_wall, idle_cpu = zip(*before[name])
        wall, cpu = zip(*times)
        lines.append(f"{name:<24}{ms(idle_wall):>12}{ms(wall):>10}"
                     f"{statistics.median(wall) / statistics.median(idle_wall):>7.1f}{ms(idle_cpu):>13}{ms(cpu):>10}"
                     f"{statistics.median(cpu) / statistics.median(idle_cpu):>7.1f}")
    lines.append(f"reconcile passes: {len(pass_s)}, one every {PASS_EVERY_S:.0f} s as beat sends them, each "
                 f"{statistics.median(pass_s):.2f} s median, {max(pass_s):.2f} s at most (asked and answered through "
                 f"the queue); the seconds, active runs and runs settled of each pass that settled any:")
    lines.append("  " + ", ".join(f"{s:.1f} s {r['runs']}/{len(r['settled'])}" for s, r in zip(pass_s, reports)
                                  if r["settled"]))
    return "\n".join(lines)


def test_many_runs_at_once_all_end_as_they_should_with_one_job_each_and_one_squeue_a_pass(
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
    client, browser = client_for(owner), Client()
    browser.force_login(owner)
    ids = []
    for i in range(RUNS):
        body = {"name": f"many-{i}", "plan": plan.pk, "dataset": (doomed_data if i < DOOMED else dataset).pk,
                "steps": 2, "max_restarts": 0}
        response = client.post("/api/runs/", body, format="json")
        assert response.status_code == 201, response.json()
        ids.append(response.json()["id"])
    pages = {"dashboard": "/", "dashboard, running": "/?status=running", "runs, through the API": "/api/runs/",
             "a run's page": f"/runs/{ids[-1]}/"}
    before = {name: [_server_time(browser, url) for _ in range(5)] for name, url in pages.items()}  # all created
    nodes_apart = slurm_cluster.jobs_at_lowest_priority() if BENCHMARK else contextlib.nullcontext()
    with nodes_apart:  # as if on machines of their own
        for run_id in ids:  # and all launched at once
            response = client.post(f"/api/runs/{run_id}/launch/", format="json")
            assert response.status_code == 200, response.json()

        reports, pass_s, during = [], [], {name: [] for name in pages}
        deadline = time.monotonic() + 400 + 6 * RUNS
        sent = None
        while time.monotonic() < deadline:
            if sent is not None:  # a pass every PASS_EVERY_S, as beat sends them
                time.sleep(max(0.0, sent + PASS_EVERY_S - time.monotonic()))
            sent = time.monotonic()
            reports.append(broker.send_task("workbench.runs.reconcile").get(timeout=120 + RUNS))
            pass_s.append(time.monotonic() - sent)
            runs = list(models.Run.objects.filter(pk__in=ids))  # afresh: a queryset would answer from its cache
            if all(r.is_finished and r.ingest_state.get("job_ended") for r in runs):
                break
            for name, url in pages.items():
                during[name].append(_server_time(browser, url))
    statuses = {r.pk: r.status for r in runs}
    expected = {pk: "failed" if i < DOOMED else "completed" for i, pk in enumerate(ids)}
    assert statuses == expected, {pk: s for pk, s in statuses.items() if s != expected[pk]}

    squeue_calls = [p["scheduler_calls"].get("slurm", 0) for p in reports if p["runs"]]
    assert squeue_calls and set(squeue_calls) == {1}, squeue_calls
    for run in runs:
        assert run.attempts == 1 and run.attempt_records.count() == 1
        name = job_name(run.pk, 1, row_stamp(run.created_at))
        named = slurm_cluster.run(["squeue", "--noheader", "--states=all", f"--name={name}",
                                   "--format=%i"]).stdout.split()
        assert named == [run.job_id], (run.pk, named)
    assert all(models.Metric.objects.filter(run_id=pk, kind="train").count() == 2 for pk in ids[DOOMED:])
    print("\n" + _figures(before, during, pass_s, reports))
