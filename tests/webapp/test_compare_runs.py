"""Runs compared: their series binned over one range (the same bin edges, so the curves overlay) and the plan and
model fields that differ; a run the user may not see is answered as one that does not exist."""
import pytest

from tests.webapp.live_runs import append_metrics, new_run, step_record
from trainer.contract import ParallelPlan
from webapp import models


@pytest.fixture
def dp4(alice, gpt2_small, cluster8):
    spec = ParallelPlan(dp=4, tp=2, micro_batch=2, global_batch=16).to_dict()
    return models.ParallelismPlan.objects.create(owner=alice, name="dp4", model_config=gpt2_small, cluster=cluster8,
                                                 spec=spec)


def _edges(points, frame):
    return {int((x - frame["start"]) / frame["bin_width"]) for x, _ in points}


def test_it_bins_two_runs_over_one_range_and_lists_their_plan_differences(alice, api, plan222, dp4, corpus):
    long = new_run(alice, plan222, corpus, name="long")
    short = new_run(alice, dp4, corpus, name="short")
    append_metrics(long, [step_record(s, 4.0 - s / 1000) for s in range(1, 3_001)])
    append_metrics(short, [step_record(s, 3.5 - s / 1000, tokens_per_step=2048) for s in range(1, 1_501)])
    answer = api(alice).get("/api/runs/compare/", {"ids": f"{long.id},{short.id}", "names": "loss", "x": "step",
                                                   "points": 100}).json()
    frame = answer["frame"]
    assert (frame["start"], frame["end"], frame["bins"]) == (1, 3_000, 50)
    assert [r["id"] for r in answer["runs"]] == [long.id, short.id]
    assert all(r["frame"] == frame for r in answer["runs"])
    long_bins = _edges(answer["runs"][0]["series"]["loss"]["points"], frame)
    short_bins = _edges(answer["runs"][1]["series"]["loss"]["points"], frame)
    assert max(short_bins) <= 25 <= max(long_bins)  # the shorter run fills the first half of the bins
    assert len(short_bins & long_bins) > 20  # where both ran, they fill the same bins
    differences = {d["field"]: d["values"] for d in answer["differences"]}
    assert differences == {"plan.dp": [2, 4], "plan.pp": [2, 1]}

    by_tokens = api(alice).get("/api/runs/compare/", {"ids": f"{long.id},{short.id}", "x": "tokens",
                                                      "points": 100}).json()
    assert by_tokens["frame"]["end"] == 3_000 * 2048 / 2 == 1_500 * 2048  # both runs end at the same tokens seen


def test_it_answers_a_run_the_user_may_not_see_as_one_that_does_not_exist(alice, bob, api, plan222, corpus):
    mine = new_run(alice, plan222, corpus)
    theirs = api(bob).get("/api/runs/compare/", {"ids": f"{mine.id}"})
    nowhere = api(bob).get("/api/runs/compare/", {"ids": "999999"})
    assert theirs.status_code == nowhere.status_code == 404
    assert theirs.json()["detail"].replace(str(mine.id), "N") == nowhere.json()["detail"].replace("999999", "N")
    assert api(alice).get("/api/runs/compare/", {"ids": f"{mine.id}"}).status_code == 200
    assert api(alice).get("/api/runs/compare/").status_code == 400
    assert api(alice).get("/api/runs/compare/", {"ids": ",".join(map(str, range(1, 12)))}).status_code == 400
