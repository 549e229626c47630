"""Runs on the test Slurm clusters (two slurmd in two network namespaces; Slurm 22.05 and 24.11, each test on both,
through Slurm's commands and through slurmrestd), launched through the REST API and a real Celery worker: sbatch,
squeue, scancel, slurmrestd at the version the launcher negotiates, and torchrun for real, one torchrun per node
meeting by c10d rendezvous."""
import time
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from tests.trainer.launch import max_rel_error
from tests.webapp.conftest import client_for
from tests.worker_fixtures import reconcile_until
from trainer.contract import ParallelPlan, presets
from trainer.contract.runfolder import METRICS, read_jsonl
from webapp import models
from workers.launchers import job_name, row_stamp

# once: what these check does not depend on the database (the SQLite pass would repeat minutes of Slurm runs)
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.once]


@pytest.fixture
def on_slurm(tiny_run_parts, any_slurm):
    """Make a plan on a Slurm cluster of ``nodes`` × ``per_node`` CPU ranks: (owner, dataset, make_plan)."""
    owner, local_plan, dataset = tiny_run_parts

    def make_plan(nodes: int = 1, per_node: int = 2, kind: str = "slurm", **plan_fields) -> models.ParallelismPlan:
        cluster = models.Cluster.objects.create(
            name=f"{kind}-{nodes}x{per_node}-{models.Cluster.objects.count()}", kind=kind,
            spec=presets.cluster("cpu", nodes=nodes, gpus_per_node=per_node).to_dict(),
            partition=any_slurm.partition, rest_url=any_slurm.rest_url if kind == "slurm-rest" else "",
            # gloo must use the link between the nodes, not the loopback the host name resolves to
            env_setup=[f"export GLOO_SOCKET_IFNAME={any_slurm.interface}"])
        cluster.full_clean()
        return models.ParallelismPlan.objects.create(
            owner=owner, name=f"p{models.ParallelismPlan.objects.count()}", model_config=local_plan.model_config,
            cluster=cluster, spec=ParallelPlan(micro_batch=2, global_batch=4, **plan_fields).to_dict())

    return owner, dataset, make_plan


def _client(owner):
    Token.objects.get_or_create(user=owner)
    owner.refresh_from_db()
    return client_for(owner)


def _create(owner, plan, dataset, **fields) -> dict:
    response = _client(owner).post("/api/runs/", {"name": "on-slurm", "plan": plan.pk, "dataset": dataset.pk,
                                                     "launch": True, **fields}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _losses(run_dir: str) -> list[float]:
    return [r["loss"] for _, r in read_jsonl(Path(run_dir) / METRICS) if "loss" in r]


# slurmrestd on each release (its API differs from release to release); Slurm's commands, the same on both, on the
# release that keeps accounting
@pytest.mark.parametrize("any_slurm, kind, plan", [("22.05", "slurm-rest", {"pp": 2}), ("24.11", "slurm", {"tp": 2}),
                                                   ("24.11", "slurm-rest", {"pp": 2})], indirect=["any_slurm"])
def test_a_two_rank_run_completes_through_the_api_with_its_batch_script_stored(broker, on_slurm, any_slurm,
                                                                                kind, plan):
    """Through Slurm's commands with tp=2, and through slurmrestd with pp=2."""
    owner, dataset, make_plan = on_slurm
    created = _create(owner, make_plan(kind=kind, **plan), dataset, steps=4, checkpoint_every=2)
    # the trainer's last records finish the run; the attempt's state comes once the job is seen to have ended
    run = reconcile_until(broker, created["id"], lambda r: r.is_finished and r.ingest_state.get("job_ended"))
    assert run.status == "completed", run.status_message
    client = _client(owner)
    shown = client.get(f"/api/runs/{run.pk}/").json()
    assert (shown["status"], shown["attempts"], shown["last_step"]) == ("completed", 1, 4)
    script = Path(run.run_dir, "job.sbatch").read_text()
    name = job_name(run.pk, 1, row_stamp(run.created_at))
    assert shown["batch_script"] == script and f"#SBATCH --job-name={name}" in script
    assert "#SBATCH --nodes=1" in script and "--nproc_per_node=2" in script
    # slurmrestd ignores a script's #SBATCH lines: there the job's name and shape came in the request
    job = any_slurm.job(int(run.job_id))
    assert (job["JobName"], job["NumNodes"], job["CPUs/Task"]) == (name, "1", "2")
    assert run.history.get(source="trainer", kind="started").data["world_size"] == 2
    steps = [m["step"] for m in client.get(f"/api/metrics/?run={run.pk}&kind=train").json()["results"]]
    assert sorted(steps) == [1, 2, 3, 4]
    assert sorted(c["step"] for c in client.get(f"/api/checkpoints/?run={run.pk}").json()["results"]) == [2, 4]
    attempt = run.attempt_records.get()
    assert (attempt.backend, attempt.job_id, attempt.state) == (kind, run.job_id, "COMPLETED")
    assert Path(run.run_dir, "logs", f"slurm-{run.job_id}.out").exists()
    # Slurm's accounting, where the cluster keeps it (24.11's has slurmdbd): read with sacct, or through
    # slurmrestd's slurmdbd endpoints
    accounted = run.history.filter(source="scheduler", kind="accounting")
    if any_slurm.accounting:
        record = accounted.get().data
        assert (record["job_id"], record["state"], record["exit_code"]) == (run.job_id, "COMPLETED", 0)
        batch = next(step for step in record["steps"] if step["step"] == "batch")
        assert batch["exit_code"] == 0 and batch["max_rss_bytes"] > 10 * 2**20  # torchrun and its two ranks
        assert record["cpu_seconds"] == record["elapsed_s"] * 2 and record["queued_s"] is not None
    else:
        assert not accounted.exists()


# each release once, each way of submitting once
@pytest.mark.parametrize("any_slurm, kind", [("22.05", "slurm"), ("24.11", "slurm-rest")], indirect=["any_slurm"])
def test_a_two_node_run_trains_across_the_namespaces_with_the_losses_of_one_process(broker, on_slurm, kind):
    owner, dataset, make_plan = on_slurm
    two_nodes = _create(owner, make_plan(nodes=2, per_node=1, kind=kind, dp=2), dataset, steps=4)
    one = _create(owner, make_plan(nodes=1, per_node=1), dataset, steps=4)  # the reference, through the commands
    runs = [reconcile_until(broker, r["id"], lambda r: r.is_finished) for r in (two_nodes, one)]
    assert [r.status for r in runs] == ["completed", "completed"], [r.status_message for r in runs]
    assert runs[0].attempt_records.get().backend == kind
    script = Path(runs[0].run_dir, "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "--nnodes=2" in script
    started = runs[0].history.get(source="trainer", kind="started")
    assert started.data["world_size"] == 2
    a, b = _losses(runs[0].run_dir), _losses(runs[1].run_dir)
    assert len(a) == len(b) == 4 and max_rel_error(a, b) < 1e-5, (a, b)


@pytest.mark.parametrize("any_slurm, kind", [("22.05", "slurm-rest"), ("24.11", "slurm"), ("24.11", "slurm-rest")],
                         indirect=["any_slurm"])
def test_cancelling_a_slurm_run_ends_its_job_within_ten_seconds(broker, on_slurm, any_slurm, kind):
    owner, dataset, make_plan = on_slurm
    created = _create(owner, make_plan(per_node=1, kind=kind), dataset, steps=100_000)
    run = reconcile_until(broker, created["id"], lambda r: r.status == "running" and r.last_step >= 2)
    asked = time.monotonic()
    response = _client(owner).post(f"/api/runs/{run.pk}/cancel/", {"reason": "enough"}, format="json")
    assert response.status_code == 200, response.json()
    while any_slurm.job(int(run.job_id))["JobState"] not in ("CANCELLED", "COMPLETED"):
        assert time.monotonic() - asked < 10, any_slurm.job(int(run.job_id))
        time.sleep(0.2)
    run = reconcile_until(broker, run.pk, lambda r: r.ingest_state.get("job_ended"))
    assert run.status == "cancelled" and time.monotonic() - asked < 10 + 5
    assert not any_slurm.run(["squeue", "--noheader", f"--jobs={run.job_id}", "--states=RUNNING,COMPLETING"],
                                 check=False).stdout.strip()
    if any_slurm.accounting:  # who cancelled it: the worker's user, by scancel
        record = run.history.get(source="scheduler", kind="accounting").data
        assert (record["state"], record["cancelled_by"]) == ("CANCELLED", "root")
