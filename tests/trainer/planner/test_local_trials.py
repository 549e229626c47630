"""LocalTrials: trial mode's measure(plan) as a real, short trainer run in a subprocess.

One real trial per world size that matters (1 process: the plain launch; 2 processes: torchrun), and failures that
must come back as errors naming their reason rather than as a step time. Steps are few: the point is the plumbing
(spec written, trainer launched, metrics read), not the timing itself; the benchmark
(python -m bench.trainer.planner.trials) is where the timings are judged.
"""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainer.contract.presets import MODELS
from trainer.contract import ParallelPlan
from trainer.planner.tune.measure import LocalTrials, TrialError, step_time_from_metrics

STEPS, WARMUP = 4, 2


def _trials(dataset, root, **kw):
    events = []
    return LocalTrials(MODELS["tiny"], dataset, root, steps=STEPS, warmup=WARMUP, timeout_s=120,
                       progress=events.append, **kw), events


def test_it_measures_a_one_process_trial_and_leaves_its_run_folder(dataset, tmp_path):
    trials, events = _trials(dataset, tmp_path)
    seconds = trials(ParallelPlan(micro_batch=2, global_batch=4))
    assert 0 < seconds < 10
    run_dir = Path(trials.runs[0]["run_dir"])
    assert run_dir.parent == tmp_path
    timing = step_time_from_metrics(run_dir / "metrics.jsonl", WARMUP)
    assert (timing.median_s, timing.steps) == (seconds, STEPS)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + WARMUP + 1))
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["cluster"]["gpus_per_node"] == 1 and spec["plan"]["precision"] == "fp32"
    assert json.loads((run_dir / "trial.json").read_text())["step_time_s"] == seconds
    assert [e["event"] for e in events] == ["started", "finished"]


@pytest.mark.slow
def test_it_measures_a_two_process_trial_under_torchrun(dataset, tmp_path):
    trials, _ = _trials(dataset, tmp_path)
    seconds = trials(ParallelPlan(dp=2, micro_batch=2, global_batch=4))
    assert 0 < seconds < 10
    record = trials.runs[0]
    assert "torch.distributed.run" in record["command"] and "--nproc_per_node=2" in record["command"]
    assert record["steps_counted"] == STEPS


def test_it_measures_a_deepspeed_plan_in_one_process(dataset, tmp_path):
    # The trainer runs both engines, so a DeepSpeed plan is measured like a native one (no torchrun for one rank).
    trials, events = _trials(dataset, tmp_path)
    seconds = trials(ParallelPlan(micro_batch=2, global_batch=4, engine="deepspeed", zero_stage=1))
    assert 0 < seconds < 10
    assert [e["event"] for e in events] == ["started", "finished"]


def test_it_raises_with_the_log_tail_when_the_dataset_is_missing(dataset, tmp_path):
    missing = replace(dataset, path=str(tmp_path / "no-such.txt"), prepared_dir=str(tmp_path / "prepared"))
    trials, _ = _trials(missing, tmp_path / "trials")
    with pytest.raises(TrialError, match="no-such.txt") as info:
        trials(ParallelPlan(micro_batch=2, global_batch=4))
    assert info.value.returncode == 1 and "Traceback" in info.value.log_tail


def test_it_refuses_a_plan_that_does_not_fit_the_model_before_launching(dataset, tmp_path):
    trials, events = _trials(dataset, tmp_path)
    with pytest.raises(TrialError, match="tp=3 does not divide n_heads=4"):
        trials(ParallelPlan(tp=3, micro_batch=2, global_batch=4))
    assert events == [] and list(tmp_path.iterdir()) == []


def test_it_imports_no_torch():
    code = "import sys, trainer.planner.tune.measure, bench.trainer.planner.trials; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
