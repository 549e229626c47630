"""The explained estimate: JSON whose every figure carries a formula, the budget, and the serving bound."""
import json

import pytest

from trainer.planner.estimate import estimate, inference_estimate
from trainer.planner.estimate.figure import Figure, walk
from trainer.planner.estimate.params import count
from trainer.contract.presets import MODELS, cluster
from trainer.contract import ParallelPlan

GPT3 = MODELS["gpt3-175b"]
MEGATRON_PLAN = ParallelPlan(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, sequence_parallel=True,
                             precision="bf16", activation_checkpointing="selective",
                             pipeline_schedule="interleaved", virtual_stages=3)


def test_it_returns_json_with_a_formula_on_every_figure():
    est = estimate(GPT3, MEGATRON_PLAN, cluster("A100-SXM-80GB", 128, gpu_hour_cost=2.0), token_budget=300e9)
    data = json.loads(json.dumps(est.to_dict()))
    assert set(data) >= {"parameters", "flops", "memory", "time", "budget", "plan", "model", "cluster", "warnings"}
    stage = data["memory"]["stages"][0]
    assert set(stage) >= {"weights", "gradients", "optimizer", "activations", "activations_per_microbatch",
                          "buffers", "overhead", "total", "rank", "stage"}
    figures = [f for part in (est.time, est.flops, est.parameters, est.budget) for top in part.values()
               for _, _, f in walk(top)]
    figures += [f for st in est.memory["stages"] for _, _, f in walk(st["total"])]
    assert figures and all(isinstance(f, Figure) and f.formula and f.unit for f in figures)
    budget = est.budget
    assert budget["gpu_hours"].value == pytest.approx(budget["time"].value * 1024 / 3600)
    assert budget["cost"].value == pytest.approx(2.0 * budget["gpu_hours"].value)
    assert est.time["step"].value == pytest.approx(sum(f.value for f in est.time["step"].terms.values()))


def test_it_bounds_decode_time_by_memory_bandwidth():
    m, c = MODELS["mixtral-8x7b"], cluster("H100-SXM", 1)
    inf = inference_estimate(m, c, tp=2, batch=4, context=4096)
    per_token = 2 * m.n_layers * m.kv_heads * m.head_dim * 2
    assert inf["kv_per_token"].value == per_token == 131072
    assert inf["kv_cache"].value == per_token * 4 * 4096
    weights_gpu = count(m).total * 2 / 2
    expected = (weights_gpu + per_token * 4 * 4096 / 2) / (c.gpu.memory_bandwidth_gbs * 1e9)
    assert inf["decode_time_per_token"].value == pytest.approx(expected)
    assert json.dumps(inf.to_dict())
