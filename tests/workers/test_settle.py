"""What a job's end means for its run, decided by reconcile from the job's state and what the run folder said."""
import json
from pathlib import Path

import pytest

from trainer.contract import ParallelPlan, presets
from webapp import models, services
from workers.launchers import JobState, JobStates
from workers.runs import UNSAVED_REQUEUES, reconcile_run

pytestmark = pytest.mark.django_db


def _running(run: models.Run, status: str = "running", **state) -> models.Run:
    models.Run.objects.filter(pk=run.pk).update(status=status, attempts=run.attempts + 1, job_id="1:gone",
                                                ingest_state={"job_ended": False, **state})
    run.refresh_from_db()
    return run


def test_a_run_stopped_at_its_time_limit_before_it_could_save_is_requeued_until_that_keeps_happening(
        tiny_run_parts, monkeypatch):
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: None)  # no worker takes it
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=0)
    killed = JobState(JobStates.FAILED, 143, "the job exited with code 143")
    for attempt in range(1, UNSAVED_REQUEUES):
        # the first attempt was stopped before its trainer had even said it started
        run = _running(run, "submitted" if attempt == 1 else "running", time_limit_near=True, started_at_step=0,
                       unsaved_requeues=run.ingest_state.get("unsaved_requeues", 0))
        assert reconcile_run(run, killed) == "queued", attempt
        run.refresh_from_db()
        assert run.restarts == 0 and run.ingest_state["next_why"] == "requeued after its time limit"
    run = _running(run, time_limit_near=True, started_at_step=0, unsaved_requeues=run.ingest_state["unsaved_requeues"])
    assert reconcile_run(run, killed) == "failed"  # attempts that keep saving nothing are a failure after all


def test_a_run_that_saved_a_checkpoint_before_it_was_killed_at_its_time_limit_is_requeued(tiny_run_parts,
                                                                                          monkeypatch):
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: None)
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=0)
    models.Checkpoint.objects.create(run=run, step=40, path="/nowhere")
    run = _running(run, time_limit_near=True, started_at_step=20, unsaved_requeues=UNSAVED_REQUEUES - 1)
    assert reconcile_run(run, JobState(JobStates.FAILED, 143)) == "queued"
    run.refresh_from_db()
    assert run.ingest_state["unsaved_requeues"] == 0


def test_a_failed_job_without_a_time_limit_uses_a_restart(tiny_run_parts, monkeypatch):
    sent = []
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: sent.append(args))
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=1)
    run = _running(run)
    assert reconcile_run(run, JobState(JobStates.FAILED, 1, "the job failed with exit code 1")) == "queued"
    run.refresh_from_db()
    assert (run.restarts, run.ingest_state["next_why"]) == (1, "restart 1 of 1 after failed")
    assert sent == [("workbench.runs.launch", run.pk)]


def test_a_node_failure_requeues_without_a_restart_avoiding_every_node_that_failed_and_counts_them(
        tiny_run_parts, monkeypatch):
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: None)
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=0)
    for failed, excluded in ((("n2",), ["n2"]), (("n1", "n2"), ["n1", "n2"]), ((), ["n1", "n2"])):
        run = _running(run, excluded_nodes=run.ingest_state.get("excluded_nodes", []))
        assert reconcile_run(run, JobState(JobStates.NODE_FAIL, None, "NODE_FAIL", failed_nodes=failed)) == "queued"
        run.refresh_from_db()
        assert (run.restarts, run.ingest_state["next_why"]) == (0, "requeued after a node failure")
        assert run.ingest_state["excluded_nodes"] == excluded
        assert f"{', '.join(failed) or 'a node'} failed under the job" in run.status_message, run.status_message
    plan.cluster.refresh_from_db()
    assert plan.cluster.node_failures == {"n1": 1, "n2": 2}


def test_a_hung_attempt_is_requeued_from_what_it_saved_or_uses_a_restart_if_it_saved_nothing(
        tiny_run_parts, monkeypatch):
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: None)
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=0)
    models.Checkpoint.objects.create(run=run, step=40, path="/nowhere")
    cancelled = JobState(JobStates.CANCELLED, None, "the job was cancelled by root")
    run = _running(run, hang={"stuck": [{"rank": 1, "host": "n2"}]}, started_at_step=20)
    assert reconcile_run(run, cancelled) == "queued"
    run.refresh_from_db()
    assert (run.restarts, run.ingest_state["next_why"]) == (0, "requeued after a hung collective")
    run = _running(run, hang={"stuck": [{"rank": 1, "host": "n2"}]}, started_at_step=40)  # nothing newer saved
    assert reconcile_run(run, cancelled) == "failed"
    assert "hung before it saved a checkpoint" in models.Run.objects.get(pk=run.pk).status_message


def test_a_run_whose_trainer_said_another_attempt_would_fail_alike_is_not_restarted(tiny_run_parts, monkeypatch):
    sent = []
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: sent.append(args))
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=2)
    run = _running(run, "failed", no_retry=True)  # a loss that spiked again where it had spiked (its failed event)
    assert reconcile_run(run, JobState(JobStates.FAILED, 1, "the job failed with exit code 1")) == "failed"
    run.refresh_from_db()
    assert run.restarts == 0 and sent == []


@pytest.fixture
def wide_plan(tiny_run_parts):
    """A plan whose activations are most of its memory (a 512-wide model on sequences of 512, 16 a micro-batch):
    the planner has somewhere to step down to."""
    owner, plan, dataset = tiny_run_parts
    model = models.ModelConfig.objects.create(owner=owner, name="wide", spec=presets.MODELS["tiny"].replace(
        n_layers=2, seq_len=512, d_model=512, n_heads=8).to_dict())
    return owner, models.ParallelismPlan.objects.create(
        owner=owner, name="wide", model_config=model, cluster=plan.cluster,
        spec=ParallelPlan(micro_batch=16, global_batch=16).to_dict()), dataset


@pytest.mark.parametrize("said_by", ["the scheduler", "the trainer"])
def test_a_run_that_ran_out_of_memory_is_replanned_within_its_global_batch_and_queued_without_a_restart(
        wide_plan, monkeypatch, said_by):
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: None)
    owner, plan, dataset = wide_plan
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=10, max_restarts=0)
    Path(run.run_dir).mkdir(parents=True)
    if said_by == "the scheduler":
        run, job = _running(run), JobState(JobStates.OUT_OF_MEMORY, 137, "StepId=7.0 exceeded memory limit")
    else:  # CUDA's allocator raised: the trainer's failed event, read in before the job ended
        run, job = _running(run, "failed", out_of_memory=True), JobState(JobStates.FAILED, 1)
    assert reconcile_run(run, job) == "queued"
    run.refresh_from_db()
    replanned = ParallelPlan.from_dict(run.spec["plan"])
    assert (replanned.micro_batch, replanned.global_batch, run.restarts) == (8, 16, 0)
    assert json.loads((Path(run.run_dir) / "spec.json").read_text()) == run.spec
    said = run.history.get(kind="replanned")
    assert "micro_batch 16 → 8" in said.message and said.data["peak_bytes"] < 0.85 * said.data["was_peak_bytes"]
    assert run.ingest_state["next_why"] == "re-planned after running out of memory"


def test_a_run_whose_owner_forbade_replanning_fails_when_it_runs_out_of_memory_and_says_what_to_change(
        wide_plan, monkeypatch):
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args, **kwargs: None)
    owner, plan, dataset = wide_plan
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=10, max_restarts=2,
                              replan_on_oom=False)
    before = run.spec
    assert reconcile_run(_running(run), JobState(JobStates.OUT_OF_MEMORY, 137)) == "failed"
    run.refresh_from_db()
    assert run.spec == before and run.restarts == 0 and "re-planning is off" in run.status_message
