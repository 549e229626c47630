"""The contract's model families (Llama, Mixtral, Qwen2-MoE fields), stage layouts and context parallel."""
import json

import pytest

from trainer.contract import SCHEMA_VERSION, ModelSpec, ParallelPlan, RopeScaling, RunSpec, SpecError, check_plan
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.contract.stages import stage_layer_counts, stage_layer_ranges

LLAMA_405B_SHAPE = ModelSpec(n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8, seq_len=8192,
                             vocab_size=128256, activation="swiglu", norm="rmsnorm", positions="rope",
                             ffn_hidden=53248, rope_base=500000.0, rope_scaling=RopeScaling(), bias=False,
                             tied_embeddings=False)


def test_a_version_1_spec_reads_unchanged_and_writes_back_as_the_current_version():
    old = {k: v for k, v in MODELS["tiny"].to_dict().items()
           if k in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size", "name")}
    spec = ModelSpec.from_dict({**old, "schema_version": 1})
    assert spec == MODELS["tiny"] and spec.norm == "layernorm" and spec.activation == "gelu"
    assert spec.to_dict()["schema_version"] == SCHEMA_VERSION == 2
    with pytest.raises(SpecError, match="schema_version 3 is not supported; this version reads 1, 2"):
        ModelSpec.from_dict({**old, "schema_version": 3})


def test_megatrons_first_and_last_stage_form_cuts_llama_405b_over_16_stages():
    plan = ParallelPlan(pp=16, global_batch=16, first_stage_layers=7, last_stage_layers=7)
    assert stage_layer_counts(126, plan) == (7,) + (8,) * 14 + (7,)
    assert check_plan(LLAMA_405B_SHAPE, plan) == {}
    even = check_plan(LLAMA_405B_SHAPE, ParallelPlan(pp=16, global_batch=16))
    assert "pp=16 does not divide n_layers=126" in even["pp"][0]


def test_each_stages_layers_may_be_given_and_must_add_up():
    plan = ParallelPlan(pp=2, global_batch=4, micro_batch=1, stage_layers=(2, 1))
    assert [list(r) for r in stage_layer_ranges(3, plan)] == [[0, 1], [2]]
    tiny3 = MODELS["tiny"].replace(n_layers=3)
    assert check_plan(tiny3, plan) == {}
    assert check_plan(tiny3, plan.replace(stage_layers=(2, 2)))["stage_layers"] == [
        "stage_layers=[2, 2] adds up to 4 layers but the model has 3"]
    interleaved = ParallelPlan(pp=2, global_batch=4, pipeline_schedule="interleaved", virtual_stages=2,
                               stage_layers=(2, 1, 1, 1))
    assert stage_layer_counts(5, interleaved) == (2, 1, 1, 1)
    assert "gives 2 stage(s) but the plan has pp×chunks=2×2=4" in check_plan(
        tiny3.replace(n_layers=5), interleaved.replace(stage_layers=(3, 2)))["stage_layers"][0]
    assert ParallelPlan(stage_layers=(2, 1)).problems()["stage_layers"] == [
        "stage layouts cut a pipeline: they need pp > 1"]


def test_context_parallel_counts_in_the_world_and_needs_two_chunks_a_rank():
    plan = ParallelPlan(dp=2, cp=2, global_batch=2)
    assert plan.world_size == 4
    assert check_plan(MODELS["tiny"], plan, local_cpu_cluster(4)) == {}
    odd = check_plan(MODELS["tiny"].replace(seq_len=66), plan)
    assert odd["cp"] == ["cp=2 cuts each sequence into 2·cp=4 equal chunks (two a rank, to balance the causal "
                         "mask): 2·cp does not divide seq_len=66"]
    assert "does not do context parallel" in ParallelPlan(cp=2, engine="deepspeed").problems()["cp"][0]


def test_the_new_model_fields_are_checked_with_their_numbers():
    base = MODELS["tiny"]
    problems = base.replace(norm_eps=0.0, rope_base=1.0, rope_scaling=RopeScaling(factor=0.5)).problems()
    assert problems["norm_eps"] == ["norm_eps=0.0 must be in (0, 1); models use 1e-5 or 1e-6"]
    assert problems["rope_base"] == ["rope_base=1.0 must be above 1 (Llama 3 uses 500,000)"]
    assert problems["rope_scaling"] == ["rope_scaling needs positions='rope'"]
    assert problems["rope_scaling.factor"] == ["factor=0.5 must be at least 1 (it stretches wavelengths)"]
    moe = base.replace(n_experts=4, top_k=5, shared_expert_gate=True, first_dense_layers=4)
    p = moe.problems()
    assert p["top_k"] == ["top_k=5 must be between 1 and n_experts=4"]
    assert p["shared_expert_gate"] == ["a shared expert's gate needs a shared expert: set shared_expert_ffn"]
    assert "leave none of the 4 layers with experts" in p["first_dense_layers"][0]


def test_family_defaults_and_derived_layers():
    llama = MODELS["tiny"].replace(activation="swiglu", norm="rmsnorm", positions="rope", bias=False)
    assert llama.ffn == 256  # 8/3 × 64 rounded up to a multiple of 256
    assert not llama.has_norm_bias and not llama.has_qkv_bias
    qwen = llama.replace(qkv_bias=True)
    assert qwen.has_qkv_bias and not qwen.has_attention_out_bias and not qwen.has_mlp_bias
    moe = llama.replace(n_layers=6, n_experts=4, first_dense_layers=1, moe_every=1)
    assert moe.moe_layers == (1, 2, 3, 4, 5)
    assert [moe.moe_layers_among(k) for k in range(7)] == [0, 0, 1, 2, 3, 4, 5]
    assert moe.moe_layers_between(2, 5) == 3
    every2 = moe.replace(moe_every=2, first_dense_layers=2)
    assert every2.moe_layers == (3, 5)
    assert [every2.moe_layers_among(k) for k in range(7)] == [
        sum(1 for i in range(k) if every2.is_moe_layer(i)) for k in range(7)]


def test_a_run_may_start_from_a_checkpoint():
    spec = RunSpec.from_json(json.dumps({
        "model": MODELS["tiny"].to_dict(), "plan": {}, "cluster": local_cpu_cluster(1).to_dict(),
        "dataset": {"path": "x"}, "output_dir": "out", "init_from": {"checkpoint": ""}}), validate=False)
    assert spec.problems()["init_from.checkpoint"] == ["give the checkpoint folder to start from"]


@pytest.mark.parametrize("preset, family", [("tiny", "gpt"), ("tiny-moe", "gpt"), ("tiny-llama", "llama"),
                                            ("tiny-mixtral", "mixtral"), ("tiny-qwen-moe", "qwen2-moe")])
def test_each_preset_names_its_family(preset, family):
    assert MODELS[preset].family == family
    assert MODELS["tiny-llama"].replace(qkv_bias=True).family == "qwen2"
