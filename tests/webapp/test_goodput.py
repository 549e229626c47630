"""Goodput: its arithmetic (webapp.goodput), a run folder's records folded into a ledger and split into parts; and
what ingestion makes of a folder, shown by the API, the run's page and the dashboard."""
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.webapp.live_runs import new_run
from trainer.contract.records import Event, is_step_row
from trainer.contract.runfolder import EVENTS, JOBS, METRICS, append_jsonl
from webapp import models
from webapp.goodput import AttemptTimes, Goodput, account, ledger_add
from webapp.services.ingest import run_ingest

EVERY = 10


def _fold(records, attempt=1):
    ledger = {}
    for record in records:
        ledger_add(ledger, record, EVERY, attempt)
    return ledger


def _job(kind, attempt, at):
    return {"event": kind, "rank": -1, "attempt": attempt, "job_id": "7", "time": at}


def _steps(attempt, first, last, start_at, save_at=(), save_s=0.5):
    """Rows of steps first..last, one second each, from ``start_at``; a save after each step in ``save_at``."""
    at, records = start_at, []
    for step in range(first, last + 1):
        at += 1.0
        records.append({"step": step, "loss": 1.0, "time": at, "since_s": 1.0, "attempt": attempt})
        if step in save_at:
            at += save_s
            records.append({"event": Event.CHECKPOINT_SAVED, "rank": 0, "step": step, "time": at,
                            "since_s": save_s, "attempt": attempt})
    return records, at


def _node_failure_then_finish(uncovered: float = 0.0):
    """Attempt 1 saves at step 20, runs to step 30 and loses its node; attempt 2 resumes from 20 and finishes.
    ``uncovered``: seconds between attempt 2's start and its first step that no record accounts for.
    (its ledger, its attempts, the time of attempt 1's last record)"""
    records, attempts, last1 = _node_failure_records(uncovered)
    return _fold(records), attempts, last1


def _node_failure_records(uncovered: float = 0.0):
    first, last1 = _steps(1, 1, 30, 104.0, save_at=(20,))
    second, last2 = _steps(2, 21, 40, 158.0 + uncovered, save_at=(40,))
    records = [_job(Event.JOB_STARTED, 1, 100.0),
               {"event": Event.STARTED, "rank": 0, "step": 0, "load_s": 0.0, "time": 104.0, "since_s": 3.9,
                "attempt": 1},
               *first,
               _job(Event.JOB_STARTED, 2, 153.0),
               {"event": Event.STARTED, "rank": 0, "step": 20, "load_s": 2.0, "time": 158.0, "since_s": 4.5,
                "attempt": 2},
               *second,
               {"event": Event.FINISHED, "rank": 0, "step": 40, "time": last2 + 0.1, "since_s": 0.1, "attempt": 2},
               _job(Event.JOB_ENDED, 2, last2 + 1.1)]
    attempts = [AttemptTimes(1, submitted=90.0, ended=150.0, ending="node_failure"),
                AttemptTimes(2, submitted=150.0, ended=181.0, ending="completed")]
    return records, attempts, last1


def test_a_node_failure_splits_into_kept_and_redone_steps_start_ups_saves_and_the_time_the_failure_cost():
    ledger, attempts, last1 = _node_failure_then_finish()
    found = account(ledger, attempts, gpus=2, now=1e9)
    assert found.allocated_s == pytest.approx(50.0 + 26.6)
    assert found.queue_s == pytest.approx(10.0 + 3.0)
    assert found.parts == pytest.approx({
        "training": 40.0, "startup": 4.0 + 3.0, "checkpoint_load": 2.0, "checkpoint_save": 1.0, "redone": 10.0,
        "other": 0.1, "shutdown": 1.0, "lost_node_failure": 150.0 - last1})
    assert list(found.parts)[:2] == ["training", "startup"]  # in the order they are shown
    assert found.share == pytest.approx(40.0 / 76.6)
    shown = found.to_dict()
    assert shown["allocated_gpu_hours"] == pytest.approx(76.6 * 2 / 3600)
    assert sum(p["seconds"] for p in shown["parts"]) == pytest.approx(shown["allocated_s"])


def test_what_the_parts_leave_out_of_the_allocation_is_shown_as_unaccounted():
    ledger, attempts, _ = _node_failure_then_finish(uncovered=3.0)
    assert account(ledger, attempts, gpus=1, now=1e9).parts["unaccounted"] == pytest.approx(3.0)


def test_while_the_next_attempt_has_not_started_training_every_step_so_far_counts_as_kept():
    ledger, attempts, _ = _node_failure_then_finish()
    del ledger["2"]
    found = account(ledger, [attempts[0], AttemptTimes(2, 150.0, None, "running")], gpus=1, now=1e9)
    assert found.parts["training"] == pytest.approx(30.0) and "redone" not in found.parts


def test_an_attempt_that_never_began_on_its_nodes_is_queue_only_and_one_that_died_starting_lost_its_time():
    ledger = _fold([_job(Event.JOB_STARTED, 2, 20.0)])
    found = account(ledger, [AttemptTimes(1, 0.0, 5.0, "failure"), AttemptTimes(2, 10.0, 30.0, "failure")],
                    gpus=1, now=1e9)
    assert (found.queue_s, found.allocated_s) == (5.0 + 10.0, 10.0)
    assert found.parts == {"lost_failure": 10.0} and found.share == 0.0


def test_records_before_the_trainer_started_and_other_ranks_reports_are_not_counted_twice():
    ledger = _fold([_job(Event.JOB_STARTED, 1, 0.0),
                    {"event": "flops_check", "rank": 0, "time": 1.0, "since_s": 1.0, "attempt": 1},
                    {"event": Event.STARTED, "rank": 0, "step": 0, "load_s": 0.0, "time": 2.0, "since_s": 1.0,
                     "attempt": 1},
                    {"step": 1, "loss": 1.0, "time": 3.0, "since_s": 1.0, "attempt": 1},
                    {"event": Event.FAILED, "rank": 1, "time": 3.5, "since_s": 3.5, "attempt": 1},
                    {"event": Event.FAILED, "rank": 0, "time": 3.6, "since_s": 0.6, "attempt": 1}])
    found = account(ledger, [AttemptTimes(1, 0.0, 5.0, "failure")], gpus=1, now=1e9)
    assert found.parts == pytest.approx({"training": 1.0, "startup": 2.0, "other": 0.6, "lost_failure": 1.4})


def test_a_record_without_its_attempt_belongs_to_the_runs_current_one():
    ledger = {}
    ledger_add(ledger, {"step": 1, "loss": 1.0, "time": 3.0, "since_s": 1.0}, EVERY, attempt=3)
    assert list(ledger) == ["3"]


def test_a_clusters_goodput_adds_its_runs_in_gpu_seconds():
    one = Goodput(gpus=1, allocated_s=10.0, queue_s=1.0, parts={"training": 8.0, "startup": 2.0})
    four = Goodput(gpus=4, allocated_s=5.0, queue_s=0.0, parts={"training": 1.0, "lost_hang": 4.0})
    total = Goodput.total([one, four, Goodput(gpus=8, allocated_s=0.0, queue_s=3.0, parts={})])
    assert (total.gpus, total.allocated_s, total.queue_s) == (1, 30.0, 1.0 + 3.0 * 8)
    assert total.parts == {"training": 12.0, "startup": 2.0, "lost_hang": 16.0} and total.share == 0.4
    assert Goodput.total([]) is None


@pytest.mark.django_db
def test_a_folder_read_in_is_shown_as_goodput_by_the_api_on_the_runs_page_and_by_cluster_on_the_dashboard(
        alice, bob, api, client, plan222, corpus):
    run = new_run(alice, plan222, corpus, steps=40, checkpoint_every=EVERY)
    records, attempts, _ = _node_failure_records()
    folder = Path(run.run_dir)
    for record in records:
        name = JOBS if record.get("rank") == -1 else METRICS if is_step_row(record) else EVENTS
        append_jsonl(folder / name, record)
    for attempt, why, state in ((attempts[0], "launched", "NODE_FAIL"),
                                (attempts[1], "requeued after a node failure", "COMPLETED")):
        models.Attempt.objects.create(run=run, number=attempt.number, backend="slurm", job_id="7", why=why,
                                      state=state, submitted_at=datetime.fromtimestamp(attempt.submitted, UTC),
                                      ended_at=datetime.fromtimestamp(attempt.ended, UTC))
    models.Run.objects.filter(pk=run.pk).update(attempts=2)
    run_ingest(run.pk)
    assert run.history.filter(kind=Event.JOB_STARTED).count() == 2

    shown = api(alice).get(f"/api/runs/{run.pk}/goodput/").json()
    expected = account(_fold(records), attempts, gpus=8, now=0.0).to_dict()
    assert shown["parts"] == expected["parts"]
    assert (shown["gpus"], round(shown["goodput"], 4)) == (8, round(40.0 / 76.6, 4))
    assert api(bob).get(f"/api/runs/{run.pk}/goodput/").status_code == 404

    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="goodput-share"' in page and "lost to a node failure" in page and "52.2%" in page
    dashboard = client.get("/").content.decode()
    assert 'data-testid="cluster-goodput"' in dashboard and plan222.cluster.name in dashboard
    by_cluster = api(bob).get(f"/api/clusters/{plan222.cluster_id}/goodput/").json()
    assert by_cluster["allocated_s"] == pytest.approx(76.6 * 8) and by_cluster["goodput"] == pytest.approx(40 / 76.6)


def test_steps_a_loss_spike_sent_the_run_back_over_are_lost_to_it_not_kept():
    rows, last = _steps(1, 1, 14, 2.0, save_at=(10,))  # a spike at step 14: back to step 10
    again, last = _steps(1, 11, 20, last)
    ledger = _fold([_job(Event.JOB_STARTED, 1, 0.0),
                    {"event": Event.STARTED, "rank": 0, "step": 0, "load_s": 0.0, "time": 2.0, "since_s": 1.0,
                     "attempt": 1}, *rows, *again, _job(Event.JOB_ENDED, 1, last)])
    found = account(ledger, [AttemptTimes(1, 0.0, last, "completed")], gpus=1, now=1e9)
    assert found.parts == pytest.approx({"training": 20.0, "startup": 2.0, "checkpoint_save": 0.5,
                                         "lost_loss_spike": 4.0})
