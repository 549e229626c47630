"""One run across its ranks: each step's per-rank figures folded into min, median and max over the ranks, with the
slowest rank named."""
import pytest

from tests.webapp.live_runs import append_metrics, new_run, step_record


@pytest.fixture
def run(alice, plan222, corpus):
    return new_run(alice, plan222, corpus)


def _ranks(step: int) -> dict:
    slow = 0.9 if step != 7 else 0.1  # rank 2 is slow every step but one
    times = [0.5, 0.52, slow, 0.51]
    return {"step_time_s": times, "tokens_per_s": [8192 / t for t in times],
            "max_allocated_bytes": [10 * 2**30, 10 * 2**30, 11 * 2**30, 12 * 2**30]}


def test_it_folds_the_ranks_of_the_latest_steps_and_names_the_slowest(alice, bob, api, run):
    append_metrics(run, [step_record(s, 3.0, ranks=_ranks(s)) for s in range(1, 21)])
    summary = api(alice).get(f"/api/runs/{run.id}/ranks/", {"steps": 10}).json()
    assert summary["steps"] == {"first": 11, "last": 20, "count": 10} and summary["world_size"] == 4
    assert summary["slowest_rank"] == 2
    step_time = summary["figures"]["step_time_s"]
    assert (step_time["min"], step_time["max"], step_time["worst_rank"]) == (0.5, 0.9, 2)
    assert step_time["median"] == pytest.approx(0.515) and step_time["per_rank"] == [0.5, 0.52, 0.9, 0.51]
    assert summary["figures"]["tokens_per_s"]["worst_rank"] == 2
    assert summary["figures"]["max_allocated_bytes"]["worst_rank"] == 3
    assert api(alice).get(f"/api/runs/{run.id}/ranks/", {"steps": 20}).json()["slowest_rank"] == 2  # step 7's outlier
    assert api(bob).get(f"/api/runs/{run.id}/ranks/").status_code == 404


def test_a_world_of_one_is_its_own_records_figures(alice, api, run):
    append_metrics(run, [step_record(s, 3.0, step_time=0.25) for s in range(1, 4)])
    summary = api(alice).get(f"/api/runs/{run.id}/ranks/").json()
    assert summary["world_size"] == 1 and summary["slowest_rank"] == 0
    assert summary["figures"]["step_time_s"]["per_rank"] == [0.25]
    assert api(alice).get(f"/api/runs/{new_run(alice, run.plan, run.dataset, name='empty').id}/ranks/").json() == {
        "steps": None, "world_size": None, "slowest_rank": None, "figures": {}}


def test_a_figure_a_rank_does_not_report_is_left_out_of_the_fold(alice, api, run):
    cpu = {"step_time_s": [0.5, 0.7], "tokens_per_s": [2.0, 1.5], "max_allocated_bytes": [None, None]}
    append_metrics(run, [step_record(s, 3.0, ranks=cpu) for s in range(1, 4)])
    summary = api(alice).get(f"/api/runs/{run.id}/ranks/").json()
    assert summary["slowest_rank"] == 1 and set(summary["figures"]) == {"step_time_s", "tokens_per_s"}
