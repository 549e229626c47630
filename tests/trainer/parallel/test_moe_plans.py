"""Mixture-of-experts models (the tiny Mixtral and Qwen2-MoE presets) under the plans that split them, each against one
process: expert parallel with a shared expert, tensor parallel (experts split like the dense MLP), pipeline stages
(the aux loss reaching backward on every stage), both at once on uneven stages, FSDP2, and DeepSpeed's MoE layer with
SwiGLU experts; and the plans the contract still refuses, with their reasons."""
import pytest

from tests.trainer.launch import job, launch, losses, max_rel_error, parity_stop, records, tiny_spec
from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS
from trainer.contract.rules import check_plan

STEPS = 12  # parity from the first step on: a split that computes otherwise shows at once
TOLERANCE = 1e-5
QWEN = MODELS["tiny-qwen-moe"]  # routed experts without renormalising, a gated shared expert
MIXTRAL = MODELS["tiny-mixtral"]
MIXTRAL_3 = MIXTRAL.replace(n_layers=3)  # three layers: two pipeline stages cannot be equal
QWEN_RENORMALISED = QWEN.replace(topk_norm="auto")  # top-2 weights renormalised, as DeepSpeed's gate weighs them
REFERENCES = {"qwen": QWEN, "mixtral": MIXTRAL, "mixtral-3": MIXTRAL_3, "qwen-renormalised": QWEN_RENORMALISED}
# name: (processes, reference, plan fields)
PLANS = {
    "dp2-ep2-shared": (2, "qwen", dict(dp=2, ep=2)),  # 2 expert shards; the shared expert dense, replicated
    "tp2-sp-shared": (2, "qwen", dict(tp=2, sequence_parallel=True)),
    "pp2": (2, "mixtral", dict(pp=2, pipeline_schedule="1f1b")),
    # zero bubble: backward split into input and weight gradients, the aux loss's share in both
    "pp2-zbv-shared": (2, "qwen", dict(pp=2, pipeline_schedule="zbv", virtual_stages=2)),
    "dp2-fsdp": (2, "mixtral", dict(dp=2, zero_stage=3)),  # every expert sharded over dp like any weight
    "tp2-pp2-uneven": (4, "mixtral-3", dict(tp=2, pp=2, stage_layers=(2, 1))),
    # SwiGLU experts kept whole (capacity_factor 0) and the gated shared expert beside DeepSpeed's layer
    "deepspeed-dp2-ep2-shared": (2, "qwen-renormalised", dict(engine="deepspeed", dp=2, ep=2, zero_stage=1)),
}


def _stop_at(name: str) -> int:
    return parity_stop(PLANS[name][2])


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory, dataset):
    """One launch per world size (references, 2 ranks, 4 ranks): ~60 s on two cores."""
    runs = tmp_path_factory.mktemp("moe-plans")
    launch(1, [job(tiny_spec(runs / f"ref-{name}", dataset, STEPS, model=model))
               for name, model in REFERENCES.items()], runs / "jobs")
    for nproc in (2, 4):
        launch(nproc, [job(tiny_spec(runs / name, dataset, STEPS, model=REFERENCES[ref], **kw), stop_at=_stop_at(name))
                       for name, (n, ref, kw) in PLANS.items() if n == nproc], runs / "jobs")
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_it_trains_a_moe_model_like_one_process(moe_runs, name):
    reference = moe_runs / f"ref-{PLANS[name][1]}"
    got = losses(moe_runs / name)
    assert len(got) == (_stop_at(name) or STEPS)
    assert max_rel_error(losses(reference)[:len(got)], got) < TOLERANCE
    # routing as one process reports it: every MoE layer of the model, in order, whichever stage holds it
    mine, ref = records(moe_runs / name)[-1], records(reference)[len(got) - 1]
    assert mine["aux_loss"] == pytest.approx(ref["aux_loss"], rel=TOLERANCE)
    assert mine["dropped_fraction"] == ref["dropped_fraction"] == 0.0
    assert len(mine["expert_load"]) == len(ref["expert_load"]) == len(REFERENCES[PLANS[name][1]].moe_layers)
    for layer, ref_layer in zip(mine["expert_load"], ref["expert_load"]):
        assert layer == pytest.approx(ref_layer, abs=1e-3)  # a token routed otherwise moves 1/4,096


def test_the_contract_lets_moe_models_use_tensor_pipeline_and_expert_parallel():
    plan = ParallelPlan(dp=2, ep=2, tp=2, pp=2, sequence_parallel=True, micro_batch=1, global_batch=8,
                        stage_layers=(3, 1))
    assert check_plan(QWEN, plan) == {}
    assert check_plan(MIXTRAL, ParallelPlan(dp=2, ep=2, engine="deepspeed", zero_stage=2, global_batch=8)) == {}


@pytest.mark.parametrize("model, plan, key, words", [
    (MIXTRAL, dict(dp=2, ep=2, zero_stage=3), "zero_stage", "hold different experts under ep=2"),
    (MIXTRAL, dict(pp=2, engine="deepspeed", zero_stage=1), "pp", "pipeline engine does not run mixture-of-experts"),
    (QWEN, dict(dp=2, engine="deepspeed", zero_stage=1), "engine", "topk_norm='none'"),
    (MIXTRAL.replace(top_k=1, topk_norm="renormalize"), dict(dp=2, engine="deepspeed"), "engine",
     "exactly when top_k > 1"),
])
def test_the_contract_refuses_what_cannot_run_moe_and_says_why(model, plan, key, words):
    problems = check_plan(model, ParallelPlan(global_batch=8, **plan))
    assert any(words in message for message in problems.get(key, [])), problems
