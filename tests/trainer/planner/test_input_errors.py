"""Bad input gets clear errors; extreme sizes do not crash."""
import json
import math

import pytest

from trainer.planner.estimate import EstimateOptions, estimate, inference_estimate
from trainer.planner.estimate.__main__ import main as estimate_main
from trainer.planner.estimate.params import count
from trainer.contract.presets import MODELS, cluster
from trainer.contract import ModelSpec, ParallelPlan, SpecError
from trainer.planner.tune.search import tune
from trainer.planner.tune.space import SearchSpace


def test_it_names_the_numbers_when_a_plan_does_not_fit_the_cluster():
    with pytest.raises(SpecError) as err:
        estimate(MODELS["gpt2-small"], ParallelPlan(dp=3, tp=2, global_batch=6), cluster("A100-SXM-80GB", 1))
    assert "dp×cp×tp×pp=3×1×2×1=6" in str(err.value) and "8 GPUs" in str(err.value)


def test_it_collects_every_problem_of_every_spec():
    bad_model = ModelSpec(n_layers=0, d_model=100, n_heads=3, seq_len=16, vocab_size=10)
    with pytest.raises(SpecError) as err:
        estimate(bad_model, ParallelPlan(dp=8, global_batch=8), cluster("A100-SXM-80GB", 1))
    assert set(err.value.errors) >= {"model.n_layers", "model.n_heads"}
    assert isinstance(err.value, ValueError)


def test_it_refuses_wrong_types_and_bad_options():
    with pytest.raises(SpecError, match="expected a ParallelPlan"):
        estimate(MODELS["tiny"], {"dp": 8}, cluster("A100-SXM-80GB", 1))
    with pytest.raises(SpecError, match="compute_efficiency"):
        estimate(MODELS["tiny"], ParallelPlan(dp=8, global_batch=8), cluster("A100-SXM-80GB", 1),
                 EstimateOptions(compute_efficiency=1.5))
    with pytest.raises(SpecError, match="unknown option"):
        EstimateOptions.from_dict({"efficiency": 0.5})
    with pytest.raises(SpecError, match="token_budget"):
        estimate(MODELS["tiny"], ParallelPlan(dp=8, global_batch=8), cluster("A100-SXM-80GB", 1), token_budget=-1)
    with pytest.raises(SpecError, match="context"):
        inference_estimate(MODELS["tiny"], cluster("A100-SXM-80GB", 1), context=0)
    with pytest.raises(SpecError, match="global_batch"):
        tune(MODELS["tiny"], cluster("A100-SXM-80GB", 1), 0)


def test_it_handles_one_layer():
    m = ModelSpec(n_layers=1, d_model=8, n_heads=1, seq_len=4, vocab_size=3)
    est = estimate(m, ParallelPlan(), cluster("A100-SXM-80GB", 1, gpus_per_node=1))
    assert est.parameters["total"].value == 1 * (12 * 64 + 13 * 8) + 3 * 8 + 4 * 8 + 16
    assert tune(m, cluster("A100-SXM-80GB", 1, gpus_per_node=1), 1).fitting > 0


def test_it_handles_ten_trillion_parameters_on_a_hundred_thousand_gpus():
    m = ModelSpec(n_layers=200, d_model=65536, n_heads=512, seq_len=8192, vocab_size=256000, name="huge")
    assert count(m).total > 1e13
    clu = cluster("H200-SXM", 12500)  # 100,000 GPUs
    plan = ParallelPlan(dp=125, tp=8, pp=100, micro_batch=1, global_batch=125 * 400, sequence_parallel=True,
                        precision="bf16", zero_stage=3, activation_checkpointing="full")
    est = estimate(m, plan, clu, token_budget=1e14)
    data = json.loads(json.dumps(est.to_dict()))
    assert math.isfinite(data["time"]["step"]["value"]) and data["memory"]["peak"]["value"] > 0
    result = tune(m, clu, 100_000, SearchSpace(engines=("native",), checkpointing=("full",),
                                               micro_batches=(1,)))
    assert result.evaluated > 0 and sum(result.rejected.values()) > 0


def test_it_warns_when_a_plan_does_not_fit():
    est = estimate(MODELS["gpt3-175b"], ParallelPlan(dp=8, global_batch=8, precision="bf16"),
                   cluster("A100-SXM-80GB", 1))
    assert not est.fits and "rank 0" in est.warnings[0]


def test_the_cli_reports_bad_input_without_a_traceback(capsys):
    assert estimate_main(["--model", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert estimate_main(["--model", "tiny", "--dp", "3", "--global-batch", "3"]) == 2
    assert "8 GPUs" in capsys.readouterr().err
