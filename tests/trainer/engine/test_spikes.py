"""Loss spikes (trainer/engine/spikes.py): judged against the steps before, answered by going back to the newest
checkpoint and skipping the batches since; a second spike at the same place stops the run. The runs are real: a
tiny model on data whose chosen batches hold random ids (spiky_data), one process each."""
import json
import math
import subprocess
import sys

import pytest

from tests.trainer.launch import REPO, tiny_spec
from tests.trainer.spiky_data import spiky_dataset
from trainer.contract import OptimizerSpec
from trainer.contract.records import Skip
from trainer.engine.spikes import DataSkips, SpikeGuard

STEPS, EVERY = 60, 10
SPIKE_BATCH = 44  # step 45's batch; the run goes back to step 40


def test_a_loss_far_above_the_median_of_the_window_or_not_finite_is_a_spike_and_stays_out_of_the_window():
    guard = SpikeGuard(factor=3.0, window=4)
    assert guard.check(1, math.nan).median is None  # not finite: a spike before the window has filled, too
    assert [guard.check(s, loss) for s, loss in enumerate([9.0, 1.0, 1.2, 1.0], start=2)] == [None] * 4
    spike = guard.check(6, 3.4)  # the median of 9, 1, 1.2, 1 is 1.1
    assert (spike.step, spike.median) == (6, pytest.approx(1.1)) and "3.1× the median" in spike.describe(3.0)
    assert guard.check(7, 3.2) is None and guard.check(8, 9.9) is not None  # 3.2 is below 3 × 1.1; now in
    off = SpikeGuard(factor=0.0, window=2)
    assert [off.check(s, x) for s, x in ((1, 1.0), (2, 1.0), (3, 1e9))] == [None] * 3 and off.check(4, math.inf)


def test_each_skip_moves_the_batches_after_it_past_what_was_skipped(tmp_path):
    Skip.write_all(tmp_path, [Skip(after_step=40, spike_step=45), Skip(after_step=70, spike_step=72)])
    skips = DataSkips(tmp_path)
    # the step after 39 steps done draws batch 39; after 40 done, batch 45 (41–45's batches were skipped) …
    assert [skips.data_step(s) for s in (0, 39, 40, 41, 69, 70, 100)] == [0, 39, 45, 46, 74, 77, 107]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Batch 44 spikes, and in a second copy batch 45 as well: the one the run draws next after skipping 41–45."""
    root = tmp_path_factory.mktemp("spiky")
    once = spiky_dataset(root / "once", 512, 64, 8, 1234, 2 * STEPS, [SPIKE_BATCH])
    twice = spiky_dataset(root / "twice", 512, 64, 8, 1234, 2 * STEPS, [SPIKE_BATCH, SPIKE_BATCH + 1])
    return once, twice


def _train(run_dir, dataset, *args):
    spec = tiny_spec(run_dir, dataset, STEPS, layers=2, checkpoint_every=EVERY,
                     optimizer=OptimizerSpec(lr=1e-2, min_lr=1e-3, warmup_steps=5))
    run_dir.mkdir(exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_dict()))
    done = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(run_dir / "spec.json"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return done, events, [(r["step"], r["loss"]) for r in rows if "loss" in r]


@pytest.mark.slow
def test_a_spike_sends_the_run_back_to_its_checkpoint_past_the_batches_since_and_a_resume_keeps_skipping_them(
        tmp_path, data):
    once, _ = data
    done, events, losses = _train(tmp_path / "straight", once)
    assert done.returncode == 0, done.stderr[-2000:]
    (spike,) = [e for e in events if e["event"] == "loss_spike"]
    assert (spike["step"], spike["rolled_back_to"], spike["skipped_steps"]) == (45, 40, [41, 45])
    assert spike["loss"] > 100 * spike["median"]
    # the rows go 1 … 45, then 41 … 60 again: every step after the rollback as low as before the spike
    assert [s for s, _ in losses] == [*range(1, 46), *range(41, STEPS + 1)]
    assert max(loss for _, loss in losses[45:]) < 3 * spike["median"]
    assert Skip.read_all(tmp_path / "straight") == [Skip(40, 45, spike["loss"], spike["median"])]

    # stopped after the rollback (at step 48) and resumed: the skip still applies, the same curve to the end
    done, _, _ = _train(tmp_path / "split", once, "--until-step", "48")
    assert done.returncode == 0, done.stderr[-2000:]
    done, _, resumed = _train(tmp_path / "split", once, "--resume")
    assert done.returncode == 0, done.stderr[-2000:]
    assert resumed[-1] == (STEPS, pytest.approx(losses[-1][1], rel=1e-6))


@pytest.mark.slow
def test_a_second_spike_where_the_run_went_back_stops_it_with_what_to_change_and_no_retry(tmp_path, data):
    _, twice = data
    done, events, losses = _train(tmp_path / "twice", twice)
    assert done.returncode != 0
    assert [e["event"] for e in events][-2:] == ["loss_spike", "failed"]
    failed = events[-1]
    assert failed["retry"] is False and "spiked again after the run went back to step 40" in failed["error"]
    assert "lower the learning rate" in failed["error"] and losses[-1][0] == 41
