"""Blends: a run trains on several datasets by weight, in an order fixed by the seed; a run killed with SIGKILL and
resumed ends where an uninterrupted one does; each source's validation loss is reported on its own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from tests.trainer.launch import JOBS, PYTHON, REPO, _env, launch, losses, records, tiny_spec
from trainer.contract import BlendSource, DatasetSpec
from trainer.contract.presets import demo_text
from trainer.data.sampler import BlendSampler

STEPS, EVERY = 24, 8


def two_sources() -> tuple[np.ndarray, np.ndarray]:
    """Source 0's ids below 100, source 1's from 100: a window says which source it came from."""
    rng = np.random.default_rng(0)
    return rng.integers(0, 100, 5_000), rng.integers(100, 200, 3_000)


def test_a_3_to_1_blend_gives_its_shares_over_1000_samples_and_the_same_batches_for_any_dp():
    a, b = two_sources()
    sampler = BlendSampler([a, b], [3.0, 1.0], seq_len=16, micro_batch=2, grad_accum=4, seed=7)
    from_a = [int((x[:, 0] < 100).sum()) for step in range(125) for x, _ in sampler.micro_batches(step)]
    assert sum(from_a) == 750 and 8 * 125 - sum(from_a) == 250  # 1,000 samples: 3:1 to the sample
    prefix = np.cumsum(from_a) / (2 * np.arange(1, len(from_a) + 1))
    assert np.all(np.abs(prefix[3:] - 0.75) <= 0.02 + 2 / (2 * np.arange(4, len(from_a) + 1)))
    # the same seed draws the same; two dp ranks together draw what one rank draws
    again = BlendSampler([a, b], [3.0, 1.0], seq_len=16, micro_batch=2, grad_accum=4, seed=7)
    assert all(np.array_equal(x, y) for (x, _), (y, _) in zip(sampler.micro_batches(9), again.micro_batches(9)))
    halves = [BlendSampler([a, b], [3.0, 1.0], seq_len=16, micro_batch=2, grad_accum=2, dp_rank=r, dp_size=2, seed=7)
              for r in (0, 1)]
    whole = np.concatenate([x for x, _ in sampler.micro_batches(9)])
    split = np.concatenate([x for h in halves for x, _ in h.micro_batches(9)])
    assert np.array_equal(whole, split)
    other_seed = BlendSampler([a, b], [3.0, 1.0], seq_len=16, micro_batch=2, grad_accum=4, seed=8)
    assert not np.array_equal(whole, np.concatenate([x for x, _ in other_seed.micro_batches(9)]))


def test_a_blend_is_refused_with_a_source_named_main_or_twice_or_weighed_nothing(tmp_path):
    data = DatasetSpec(path=str(tmp_path / "a.txt"))
    spec = tiny_spec(tmp_path / "run", data, 4)
    assert "blend" in spec.replace(blend=(BlendSource("main", data),)).problems()
    assert "blend" in spec.replace(blend=(BlendSource("x", data), BlendSource("x", data))).problems()
    assert "blend[0].weight" in spec.replace(blend=(BlendSource("x", data, weight=0.0),)).problems()
    assert "dataset_weight" in spec.replace(dataset_weight=-1.0).problems()


@pytest.fixture(scope="module")
def blend_runs(tmp_path_factory):
    """The same 3:1 blend run straight through, and run again, killed with SIGKILL after its first checkpoint and
    resumed."""
    root = tmp_path_factory.mktemp("blend")
    text = demo_text(300_000).decode()
    (root / "plays.txt").write_text(text[:150_000])
    (root / "talk.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in text[150_000:].split("\n\n")))
    main = DatasetSpec(path=str(root / "plays.txt"), prepared_dir=str(root / "p-plays"))
    other = BlendSource("talk", DatasetSpec(path=str(root / "talk.jsonl"), prepared_dir=str(root / "p-talk")), 1.0)

    def spec(name):
        return tiny_spec(root / name, main, STEPS, layers=2, blend=(other,), dataset_weight=3.0, eval_every=EVERY,
                         checkpoint_every=EVERY)
    launch(1, [{"spec": spec("straight"), "run_dir": root / "straight", "resume": False, "stop_at": 0}], root / "j1")
    killed = spec("killed")
    jobs = root / "killed.json"
    jobs.write_text(json.dumps([{"spec": killed.to_dict(), "run_dir": str(root / "killed"), "resume": False,
                                 "stop_at": 0}]))
    process = subprocess.Popen([PYTHON, *JOBS, str(jobs)], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    first = root / "killed" / "checkpoints" / f"step-{EVERY}" / "manifest.json"
    deadline = time.monotonic() + 300
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert first.exists() and not any(e["event"] == "finished" for e in records(root / "killed", "events.jsonl"))
    launch(1, [{"spec": killed, "run_dir": root / "killed", "resume": True, "stop_at": 0}], root / "j2")
    return root


def test_a_blend_killed_and_resumed_ends_with_the_loss_of_an_uninterrupted_run(blend_runs):
    straight = losses(blend_runs / "straight")
    resumed = {r["step"]: r["loss"] for r in records(blend_runs / "killed") if "loss" in r}  # a redone step's last
    assert len(straight) == STEPS and sorted(resumed) == list(range(1, STEPS + 1))
    assert abs(resumed[STEPS] - straight[-1]) <= 1e-6 * abs(straight[-1])


def test_each_source_of_a_blend_has_its_own_validation_loss_and_the_blend_their_mean_by_weight(blend_runs):
    rows = [r for r in records(blend_runs / "straight") if "val_loss" in r]
    assert [r["step"] for r in rows] == [EVERY, 2 * EVERY, 3 * EVERY]
    for r in rows:
        by_source = r["val_loss_by_source"]
        assert set(by_source) == {"main", "talk"} and by_source["main"] != by_source["talk"]
        assert r["val_loss"] == pytest.approx((3 * by_source["main"] + by_source["talk"]) / 4, rel=1e-12)
    assert rows[-1]["val_loss_by_source"]["talk"] < rows[0]["val_loss_by_source"]["talk"]
