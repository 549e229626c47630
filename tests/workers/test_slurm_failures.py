"""Failures provoked for real on the test Slurm cluster (24.11), each answered without a person: the run ends as an
uninterrupted run of the same plan ends, and its history says what happened and what was done about it."""
import os
import re
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from tests.slurm_cluster import PREEMPTIBLE, PREEMPTING, SMALL_MEMORY
from tests.trainer.spiky_data import spiky_dataset
from tests.webapp.conftest import client_for
from tests.worker_fixtures import final_loss, log_tails, reconcile_until
from trainer.contract import ParallelPlan, presets
from trainer.contract.records import Heartbeat
from trainer.contract.runfolder import JOBS, read_jsonl
from webapp import models

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.once]


@pytest.fixture
def plans(tiny_run_parts, slurm_cluster_24):
    """Make plans on the 24.11 cluster, its ranks beating every second: (client, make_plan, dataset)."""
    owner, local_plan, dataset = tiny_run_parts
    Token.objects.get_or_create(user=owner)
    owner.refresh_from_db()

    def make_plan(ranks: int = 1, partition: str = slurm_cluster_24.partition, qos: str = "", nodes: int = 1,
                  model: models.ModelConfig | None = None, plan: ParallelPlan | None = None) -> models.ParallelismPlan:
        cluster = models.Cluster.objects.create(
            name=f"slurm-24-{models.Cluster.objects.count()}", kind="slurm", partition=partition, qos=qos,
            spec=presets.cluster("cpu", nodes=nodes, gpus_per_node=ranks // nodes).to_dict(),
            env_setup=[f"export GLOO_SOCKET_IFNAME={slurm_cluster_24.interface}", "export WORKBENCH_HEARTBEAT_S=1"])
        cluster.full_clean()
        return models.ParallelismPlan.objects.create(
            owner=owner, name=f"p{cluster.pk}", model_config=model or local_plan.model_config, cluster=cluster,
            spec=(plan or ParallelPlan(dp=ranks, micro_batch=2, global_batch=4)).to_dict())

    return client_for(owner), make_plan, dataset


def _start(client, plan, dataset, name: str, **fields) -> int:
    response = client.post("/api/runs/", {"name": name, "plan": plan.pk, "dataset": dataset.pk, "launch": True,
                                          "max_restarts": 0, **fields}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _until(what: str, done, run_id: int, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = done()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s\n{log_tails(models.Run.objects.get(pk=run_id))}")


def test_a_hung_collective_is_cancelled_naming_the_frozen_rank_and_the_run_resumes_to_the_same_loss(
        broker, plans, slurm_cluster_24):
    client, make_plan, dataset = plans
    plan = make_plan(ranks=2)
    # saved at steps 200 and 400: rank 1 is frozen in a step between them, a hundred steps clear of a save (a live
    # rank that saves is not judged, and rank 0 would wait for the frozen one in the save's closing barrier)
    steps = dict(steps=400, checkpoint_every=200)
    hung_id = _start(client, plan, dataset, "hangs", **steps)
    reference_id = _start(client, plan, dataset, "uninterrupted", **steps)
    folder = Path(reconcile_until(broker, hung_id, lambda r: r.run_dir and r.job_id).run_dir)

    # Rank 1 freezes (SIGSTOP) once its own log says it is past step 200's save: rank 0 waits for it in the next
    # collective. Its log line is written as the step ends; its heartbeat, every second, is too late to tell.
    def stepping_past_the_save():
        beats, log = Heartbeat.read_all(folder), folder / "logs" / "rank-1.log"
        steps_logged = re.findall(r"rank 1: step (\d+) ", log.read_text()) if log.exists() else []
        return len(beats) == 2 and steps_logged and 200 < int(steps_logged[-1]) < 300 and beats

    beats = _until("rank 1 past step 200's save", stepping_past_the_save, hung_id)
    os.kill(beats[1].pid, signal.SIGSTOP)
    try:
        hung = reconcile_until(broker, hung_id, lambda r: r.history.filter(kind="hang").exists(), timeout=60)
    except BaseException:
        os.kill(beats[1].pid, signal.SIGCONT)  # not found: the job must not stay frozen on the cluster
        raise
    said = hung.history.get(kind="hang")
    node = slurm_cluster_24.job(int(hung.attempt_records.get(number=1).job_id))["NodeList"]
    assert said.data["stuck"] == [{"rank": 1, "host": node}] and "frozen" in said.data["why"], said.message
    # past the limit, as the event's figures (to 0.1 s) say it: 25.04 s of silence is recorded as 25.0
    assert f"rank 1 on {node}" in said.message and said.data["silent_s"] >= said.data["limit_s"] >= 25

    runs = [reconcile_until(broker, pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"), timeout=240)
            for pk in (hung_id, reference_id)]
    hung, reference = runs
    assert [r.status for r in runs] == ["completed", "completed"], [r.status_message for r in runs]
    first, second = hung.attempt_records.order_by("number")
    assert (first.state, first.counts_as_restart) == ("CANCELLED", False)
    assert second.resume and second.why == "requeued after a hung collective"
    assert (hung.attempts, hung.restarts, reference.attempts) == (2, 0, 1)
    assert hung.history.get(source="trainer", kind="started", attempt=2).data["step"] >= 200
    assert abs(final_loss(hung) - final_loss(reference)) <= 1e-6, (final_loss(hung), final_loss(reference))


def test_a_preempted_run_saves_on_the_signal_and_resumes_without_a_restart_to_the_same_loss(
        broker, plans, slurm_cluster_24):
    client, make_plan, dataset = plans
    steps = dict(steps=400, checkpoint_every=100)
    # the preemptible run alone on n1, the uninterrupted one on n2
    preempted_id = _start(client, make_plan(partition="n1", qos=PREEMPTIBLE), dataset, "preemptible", **steps)
    reference_id = _start(client, make_plan(partition="n2"), dataset, "uninterrupted", **steps)
    folder = Path(reconcile_until(broker, preempted_id, lambda r: r.run_dir and r.job_id).run_dir)
    _until("step 100 saved", lambda: (folder / "checkpoints" / "step-100" / "manifest.json").exists(), preempted_id)
    # a job of the preempting QOS that wants all of n1's CPUs
    urgent = slurm_cluster_24.sbatch("-p", "n1", f"--qos={PREEMPTING}", "--cpus-per-task=8", "--output=/dev/null",
                                     "--wrap", "sleep 3")

    runs = [reconcile_until(broker, pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"), timeout=240)
            for pk in (preempted_id, reference_id)]
    preempted, reference = runs
    assert [r.status for r in runs] == ["completed", "completed"], [r.status_message for r in runs]
    assert slurm_cluster_24.job(urgent)["JobState"] == "COMPLETED"
    first, second = preempted.attempt_records.order_by("number")
    assert (first.state, first.counts_as_restart) == ("PREEMPTED", False), first.reason
    assert second.resume and second.why == "requeued after a stop signal (preemption)"
    assert (preempted.attempts, preempted.restarts, reference.attempts) == (2, 0, 1)
    # it saved where the signal found it, past its last regular checkpoint, and went on from there
    stopped = preempted.history.get(source="trainer", kind="stopped", attempt=1).data["step"]
    assert 100 < stopped < 400
    assert preempted.history.get(source="trainer", kind="started", attempt=2).data["step"] == stopped
    assert preempted.history.filter(source="scheduler", kind="preempted", attempt=1).exists()
    assert abs(final_loss(preempted) - final_loss(reference)) <= 1e-6, (final_loss(preempted),
                                                                         final_loss(reference))


def test_a_node_failure_requeues_the_run_without_that_node_counts_it_and_the_run_ends_with_the_same_loss(
        broker, plans, slurm_cluster_24):
    client, make_plan, dataset = plans
    steps = dict(steps=400, checkpoint_every=100)
    plan = make_plan()  # the whole partition: the next attempt may go anywhere the scheduler is not told to avoid
    failing_id = _start(client, plan, dataset, "node-fails", **steps)
    job_id = int(reconcile_until(broker, failing_id, lambda r: r.run_dir and r.job_id).job_id)
    node = _until("the job placed", lambda: slurm_cluster_24.job(job_id)["NodeList"] in slurm_cluster_24.nodes
                  and slurm_cluster_24.job(job_id)["NodeList"], failing_id)
    (other,) = set(slurm_cluster_24.nodes) - {node}
    reference_id = _start(client, make_plan(partition=other), dataset, "uninterrupted", **steps)
    folder = Path(models.Run.objects.get(pk=failing_id).run_dir)
    _until("step 100 saved", lambda: (folder / "checkpoints" / "step-100" / "manifest.json").exists(), failing_id)
    slurm_cluster_24.fail_node(node)
    try:
        runs = [reconcile_until(broker, pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"),
                                timeout=240) for pk in (failing_id, reference_id)]
    finally:
        slurm_cluster_24.restore_node(node)
    failing, reference = runs
    assert [r.status for r in runs] == ["completed", "completed"], [r.status_message for r in runs]
    first, second = failing.attempt_records.order_by("number")
    assert (first.state, first.counts_as_restart) == ("NODE_FAIL", False), first.reason
    assert second.why == "requeued after a node failure" and f"#SBATCH --exclude={node}\n" in second.script
    assert slurm_cluster_24.job(int(second.job_id))["NodeList"] == other
    assert (failing.attempts, failing.restarts) == (2, 0)
    assert failing.history.get(source="trainer", kind="started", attempt=2).data["step"] >= 100
    # counted on the cluster, and shown with it
    shown = client.get(f"/api/clusters/{plan.cluster_id}/").json()
    assert shown["node_failures"] == {node: 1}, shown
    assert abs(final_loss(failing) - final_loss(reference)) <= 1e-6, (final_loss(failing), final_loss(reference))

    # Goodput adds up: its parts, each measured apart, come to the time the two jobs held their node (1 %), and
    # the allocation is at least what Slurm gives from the moment each batch script began (its times are whole
    # seconds; how long slurmd took to start a script is the machine's load, and before it the workbench sees
    # nothing): the lost attempt, which wrote no end, ends when the workbench saw it end, a reconcile pass after
    # Slurm did
    goodput = client.get(f"/api/runs/{failing_id}/goodput/").json()
    parts = {part["name"]: part["seconds"] for part in goodput["parts"]}
    measured = sum(seconds for name, seconds in parts.items() if name != "unaccounted")
    assert abs(measured - goodput["allocated_s"]) <= 0.01 * goodput["allocated_s"], goodput
    jobs = [slurm_cluster_24.job(int(a.job_id)) for a in (first, second)]
    held = sum(_slurm_elapsed(job) for job in jobs)
    script_started = {r["attempt"]: r["time"] for _, r in read_jsonl(folder / JOBS) if r["event"] == "job_started"}
    before_scripts = sum(max(0.0, script_started[a.number] - datetime.fromisoformat(job["StartTime"]).timestamp())
                         for a, job in zip((first, second), jobs))
    assert held - before_scripts - 2 * 1.5 <= goodput["allocated_s"] <= held + 10, \
        (goodput["allocated_s"], held, before_scripts)
    assert min(parts["training"], parts["checkpoint_load"], parts["lost_node_failure"]) > 0, parts
    assert goodput["goodput"] == pytest.approx(parts["training"] / goodput["allocated_s"])



def test_a_loss_spike_sends_the_run_back_to_its_checkpoint_and_the_batches_it_skipped_are_listed(broker, plans):
    client, make_plan, corpus = plans
    # a dataset whose batch 44 (step 45's) holds random ids in a cycle the model has learnt by then
    data = spiky_dataset(Path(corpus.path).parent / "spiky", 512, 64, 4, 1234, 120, [44])
    dataset = models.Dataset.objects.create(owner=corpus.owner, name="spiky", path=data.path, tokenizer=data.tokenizer)
    run_id = _start(client, make_plan(), dataset, "spiky", steps=60, checkpoint_every=10,
                    optimizer={"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 5})
    run = reconcile_until(broker, run_id, lambda r: r.is_finished and r.ingest_state.get("job_ended"), timeout=240)
    assert (run.status, run.attempts, run.restarts) == ("completed", 1, 0), run.status_message
    said = client.get(f"/api/runs/{run_id}/events/").json()["results"]
    (spike,) = [e for e in said if e["kind"] == "loss_spike"]
    assert (spike["data"]["rolled_back_to"], spike["data"]["skipped_steps"]) == (40, [41, 45])
    assert "back to step 40, the batches of steps 41–45 skipped" in spike["message"]
    # the rows of steps 41–45 are those done again, past the skipped batches: as low as before the spike
    redone = run.metrics.get(kind="train", step=45).loss
    assert redone < spike["data"]["loss"] / 100 and run.last_step == 60
    goodput = client.get(f"/api/runs/{run_id}/goodput/").json()
    lost = next(part["seconds"] for part in goodput["parts"] if part["name"] == "lost_loss_spike")
    assert 0 < lost < goodput["allocated_s"] / 2, goodput



def test_a_straggling_rank_is_named_with_its_host_and_the_run_ends_with_the_loss_of_one_that_did_not_straggle(
        broker, plans, slurm_cluster_24):
    client, make_plan, dataset = plans
    steps = dict(steps=300, checkpoint_every=300)
    straggling_id = _start(client, make_plan(ranks=2, nodes=2), dataset, "straggles", **steps)
    folder = Path(reconcile_until(broker, straggling_id, lambda r: r.run_dir and r.job_id).run_dir)
    beats = _until("both ranks stepping", lambda: len(b := Heartbeat.read_all(folder)) == 2 and b[1].step > 0 and b,
                   straggling_id)
    # rank 1 runs half the time, stopped and continued every 3 ms (its own work takes 4 ms a step), as a GPU that
    # throttles itself
    done = threading.Event()

    def throttle():
        while not done.is_set():
            os.kill(beats[1].pid, signal.SIGSTOP)
            time.sleep(0.003)
            os.kill(beats[1].pid, signal.SIGCONT)
            time.sleep(0.003)

    throttling = threading.Thread(target=throttle, daemon=True)
    throttling.start()
    rank_1 = {"rank": 1, "host": beats[1].host}
    try:
        named = reconcile_until(broker, straggling_id, lambda r: any(
            e.data.get("straggler") == rank_1 for e in r.history.filter(kind="straggler")), timeout=120)
    finally:
        done.set()
        throttling.join()
    said = next(e for e in named.history.filter(kind="straggler") if e.data["straggler"] == rank_1)
    assert said.data["ratio"] > 1.5 and f"rank 1 on {beats[1].host} is a straggler" in said.message, said.message
    assert beats[1].host in named.ingest_state["straggler_nodes"]
    straggled = reconcile_until(broker, straggling_id, lambda r: r.is_finished and r.ingest_state.get("job_ended"),
                                timeout=240)
    # every rank's own compute time is among the run's rank figures
    ranks = client.get(f"/api/runs/{straggling_id}/ranks/").json()
    assert len(ranks["figures"]["compute_s"]["per_rank"]) == 2 and min(ranks["figures"]["compute_s"]["per_rank"]) > 0
    # the same plan again, once the first has ended (two runs of two ranks on this machine's two cores would make
    # stragglers of their own)
    reference_id = _start(client, make_plan(ranks=2, nodes=2), dataset, "uninterrupted", **steps)
    reference = reconcile_until(broker, reference_id, lambda r: r.is_finished and r.ingest_state.get("job_ended"),
                                timeout=240)
    assert [r.status for r in (straggled, reference)] == ["completed", "completed"], reference.status_message
    assert abs(final_loss(straggled) - final_loss(reference)) <= 1e-6, (final_loss(straggled), final_loss(reference))


def test_a_run_that_runs_out_of_memory_is_replanned_and_ends_as_a_run_of_the_new_plan_from_the_start(broker, plans):
    client, make_plan, dataset = plans
    # activations are most of this model's memory: its process holds 1.24 GB at 16 sequences a micro-batch,
    # 0.92 GB at 8
    wide = models.ModelConfig.objects.create(owner=dataset.owner, name="wide", spec=presets.MODELS["tiny"].replace(
        n_layers=2, seq_len=512, d_model=512, n_heads=8).to_dict())
    steps = dict(steps=3, checkpoint_every=3)
    # the plan the planner steps down to, on a node of plenty; once it has prepared the dataset (tokenizing takes
    # memory of its own), the plan that needs more on the partition of 1.1 GB a CPU
    reference_id = _start(client, make_plan(partition="n2", model=wide,
                                            plan=ParallelPlan(micro_batch=8, global_batch=16)), dataset, "fits", **steps)
    reconcile_until(broker, reference_id, lambda r: r.history.filter(kind="started").exists(), timeout=120)
    oom_id = _start(client, make_plan(partition=SMALL_MEMORY, model=wide,
                                      plan=ParallelPlan(micro_batch=16, global_batch=16)), dataset, "big", **steps)
    runs = [reconcile_until(broker, pk, lambda r: r.is_finished and r.ingest_state.get("job_ended"), timeout=240)
            for pk in (oom_id, reference_id)]
    replanned, reference = runs
    assert [r.status for r in runs] == ["completed", "completed"], [r.status_message for r in runs]
    first, second = replanned.attempt_records.order_by("number")
    assert (first.state, first.counts_as_restart) == ("OUT_OF_MEMORY", False) and "memory limit" in first.reason
    assert second.why == "re-planned after running out of memory" and replanned.restarts == 0
    said = replanned.history.get(kind="replanned")
    assert "micro_batch 16 → 8" in said.message and said.data["plan"]["global_batch"] == 16, said.message
    assert replanned.spec["plan"] == reference.spec["plan"]
    assert abs(final_loss(replanned) - final_loss(reference)) <= 1e-6, (final_loss(replanned), final_loss(reference))


def _slurm_elapsed(job: dict) -> float:
    started, ended = (datetime.fromisoformat(job[key]) for key in ("StartTime", "EndTime"))
    return (ended - started).total_seconds()
