"""Chart series: downsampled with every extreme kept, finer for a narrower range, right after a resumed attempt
redoes steps, on any x axis, and read from a few thousand rows however long the run."""
import random

import pytest

from tests.webapp.live_runs import START, append_metrics, eval_record, new_run, rows_read, step_record
from webapp.models import Series, SeriesBucket, SeriesStep
from webapp.models.series_blocks import LEVELS, Block, Point, width
from webapp.selectors.series import series_read
from webapp.services.series import series_write


@pytest.fixture
def run(alice, plan222, corpus):
    return new_run(alice, plan222, corpus)


def _noisy(steps: int, seed: int = 7) -> dict[int, float]:
    rng = random.Random(seed)
    return {s: 3.0 - s / steps + rng.gauss(0, 0.2) for s in range(1, steps + 1)}


def test_it_keeps_the_global_min_and_max_of_a_noisy_series_within_the_points_asked(run):
    losses = _noisy(10_000)
    append_metrics(run, [step_record(s, v) for s, v in losses.items()])
    answer = series_read(run, ["loss"], "step", points=200)["series"]["loss"]
    assert answer["downsampled"] and answer["count"] == 10_000
    assert 100 < len(answer["points"]) <= 200
    low, high = min(losses, key=losses.get), max(losses, key=losses.get)
    assert [low, losses[low]] in answer["points"] and [high, losses[high]] in answer["points"]
    assert all(losses[step] == value for step, value in answer["points"])  # only points the run recorded


def test_a_narrower_range_returns_finer_steps(run):
    append_metrics(run, [step_record(s, v) for s, v in _noisy(10_000).items()])
    whole = series_read(run, ["loss"], "step", points=200)
    zoomed = series_read(run, ["loss"], "step", start=4_000, end=6_000, points=200)
    closer = series_read(run, ["loss"], "step", start=5_000, end=5_099, points=200)
    assert whole["block_steps"] > zoomed["block_steps"] > closer["block_steps"] == 1
    steps = [step for step, _ in zoomed["series"]["loss"]["points"]]
    assert 4_000 <= steps[0] and steps[-1] <= 6_000 and len(steps) > 100
    assert [step for step, _ in closer["series"]["loss"]["points"]] == list(range(5_000, 5_100))
    assert not closer["series"]["loss"]["downsampled"]


def test_a_resumed_attempt_that_redoes_steps_replaces_them_in_the_served_series(run):
    first = {s: (50.0 if s == 2_500 else 1.0) for s in range(1, 3_001)}  # a spike the second attempt never had
    append_metrics(run, [step_record(s, v) for s, v in first.items()])
    assert max(v for _, v in series_read(run, ["loss"], "step", points=100)["series"]["loss"]["points"]) == 50.0

    append_metrics(run, [step_record(s, 0.5) for s in range(2_001, 2_801)])  # resumed from step 2,000, then died
    served = series_read(run, ["loss"], "step", points=100)["series"]["loss"]["points"]
    assert max(v for _, v in served) == 1.0 and min(v for _, v in served) == 0.5
    exact = series_read(run, ["loss"], "step", start=1_990, end=2_810, points=2_000)["series"]["loss"]["points"]
    assert dict(map(tuple, exact)) == {s: (0.5 if 2_001 <= s <= 2_800 else 1.0) for s in range(1_990, 2_811)}
    _assert_blocks_fold_their_steps(run)


def test_the_rollups_equal_a_fold_from_scratch_after_replays_gaps_and_nans(run):
    rng = random.Random(3)
    at = 0
    for _ in range(12):
        if at and rng.random() < 0.4:
            at = rng.randrange(max(at - 3_000, 0), at)  # a resume from an earlier checkpoint
        count = rng.randrange(1, 2_500)
        records = []
        for s in range(at + 1, at + count + 1):
            loss = float("nan") if rng.random() < 0.02 else rng.gauss(2, 1)
            records.append(step_record(s, loss))
            if s % 50 == 0:
                records.append(eval_record(s, rng.gauss(2, 1)))
        at += count
        series_write(run, records)
    _assert_blocks_fold_their_steps(run)


def _assert_blocks_fold_their_steps(run):
    columns = {s: s.label for s in Series}
    rows = list(SeriesStep.objects.filter(run=run).values_list("step", "tokens_seen", "wall_time", *columns.values()))
    expected = {}
    for series_index, series in enumerate(Series):
        for step, tokens, wall, *values in rows:
            if values[series_index] is None:
                continue
            point = Block.of(Point(values[series_index], step, tokens, wall))
            for level in LEVELS:
                key = (int(series), level, step // width(level))
                expected[key] = point.merged(expected.get(key))
    stored = {(b.series, b.level, b.bucket): Block(b.count, Point(b.min_value, b.min_step, b.min_tokens, b.min_wall),
                                                   Point(b.max_value, b.max_step, b.max_tokens, b.max_wall))
              for b in SeriesBucket.objects.filter(run=run)}
    assert stored == expected


def test_it_charts_against_tokens_seen_and_time_since_the_first_step_began(run):
    append_metrics(run, [step_record(s, 1.0 + s, tokens_per_step=1000, step_time=0.5) for s in range(1, 101)]
                   + [eval_record(50, 7.0)])
    tokens = series_read(run, ["loss", "val_loss"], "tokens", start=10_000, end=20_000)["series"]
    assert [x for x, _ in tokens["loss"]["points"]] == list(range(10_000, 20_001, 1000))
    assert tokens["val_loss"]["points"] == []
    assert series_read(run, ["val_loss"], "tokens")["series"]["val_loss"]["points"] == [[50_000, 7.0]]
    time = series_read(run, ["loss"], "time", start=0, end=2.0)["series"]["loss"]["points"]
    assert time == [[0.5, 2.0], [1.0, 3.0], [1.5, 4.0], [2.0, 5.0]]  # step 1 ended half a second after it began
    assert SeriesStep.objects.get(run=run, step=1).wall_time == START + 0.5
    run.delete()
    assert not SeriesStep.objects.exists() and not SeriesBucket.objects.exists()


def test_a_chart_of_a_long_run_reads_a_few_thousand_rows_not_the_run(run):
    steps = 60_000
    series_write(run, [{"step": s, "loss": 1.0 + (s % 97) / 97, "tokens_seen": s, "time": START + s}
                       for s in range(1, steps + 1)])
    assert SeriesStep.objects.filter(run=run).count() == steps
    answer = {}

    def chart():
        answer.update(series_read(run, ["loss"], "step", start=1_234, end=59_001, points=500))

    read = rows_read(chart)
    assert len(answer["series"]["loss"]["points"]) <= 500 and answer["series"]["loss"]["count"] == 59_001 - 1_233
    assert read < 1_500, read


def test_the_endpoint_serves_named_series_to_those_who_may_see_the_run(alice, bob, api, run):
    append_metrics(run, [step_record(s, 2.0, lr=1e-3 * s) for s in range(1, 11)] + [eval_record(10, 2.5)])
    answer = api(alice).get(f"/api/runs/{run.id}/series/", {"names": "loss,lr,val_loss", "x": "step",
                                                            "points": 2000}).json()
    assert set(answer["series"]) == {"loss", "lr", "val_loss"} and answer["x"] == "step"
    assert answer["series"]["lr"]["points"][-1] == [10, pytest.approx(1e-2)]
    assert answer["series"]["val_loss"] == {"points": [[10, 2.5]], "downsampled": False, "count": 1}
    assert api(bob).get(f"/api/runs/{run.id}/series/").status_code == 404
    for bad in ({"names": "loss,nope"}, {"x": "epoch"}, {"start": 5, "end": 4}, {"points": 1}, {"start": "nan"},
                {"end": "1e300"}, {"x": ""}, {"start": "", "end": ""}):
        assert api(alice).get(f"/api/runs/{run.id}/series/", bad).status_code == 400, bad
    # an empty parameter is not the default: the answer says to give a value or leave it out
    assert api(alice).get(f"/api/runs/{run.id}/series/", {"x": ""}).json() == {
        "x": ["give a value, or leave the parameter out"]}
    for x in ("step", "tokens", "time"):  # the widest range each axis takes
        assert api(alice).get(f"/api/runs/{run.id}/series/", {"x": x, "start": -2.0**63, "end": 2.0**63}).json()[
            "series"]["loss"]["count"] == 10
