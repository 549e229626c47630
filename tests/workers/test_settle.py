"""What a job's end means for its run, decided by reconcile from the job's state and what the run folder said."""
import pytest

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
    monkeypatch.setattr("workers.runs.services.enqueue", lambda *args: None)  # no worker takes the requeued launch
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
    monkeypatch.setattr("workers.runs.services.enqueue", lambda *args: None)
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=0)
    models.Checkpoint.objects.create(run=run, step=40, path="/nowhere")
    run = _running(run, time_limit_near=True, started_at_step=20, unsaved_requeues=UNSAVED_REQUEUES - 1)
    assert reconcile_run(run, JobState(JobStates.FAILED, 143)) == "queued"
    run.refresh_from_db()
    assert run.ingest_state["unsaved_requeues"] == 0


def test_a_failed_job_without_a_time_limit_uses_a_restart(tiny_run_parts, monkeypatch):
    sent = []
    monkeypatch.setattr("webapp.services.runs.enqueue", lambda *args: sent.append(args))
    owner, plan, dataset = tiny_run_parts
    run = services.run_create(owner=owner, name="r", plan=plan, dataset=dataset, steps=100, max_restarts=1)
    run = _running(run)
    assert reconcile_run(run, JobState(JobStates.NODE_FAIL, None, "a node of the job failed (NODE_FAIL)")) == "queued"
    run.refresh_from_db()
    assert (run.restarts, run.ingest_state["next_why"]) == (1, "restart 1 of 1 after node_fail")
    assert sent == [("workbench.runs.launch", run.pk)]
