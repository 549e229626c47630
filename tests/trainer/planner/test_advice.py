"""Architecture advice: the matmul-shape model on known shapes, and the suggestions for published models."""
import pytest

from trainer.contract import ParallelPlan, SpecError
from trainer.contract.presets import MODELS, cluster, local_cpu_cluster
from trainer.planner.advice import Gemm, advise, gemm_efficiency
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.gpu_kernels import kernels_for
from trainer.planner.estimate.numbers import IN_MICROBATCH
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.flops import model_flops_per_token

A100 = kernels_for("A100-SXM-80GB")
GPT2 = MODELS["gpt2-small"]
DP8 = ParallelPlan(dp=8, micro_batch=8, global_batch=64, precision="bf16")
TP2 = ParallelPlan(dp=4, tp=2, micro_batch=8, global_batch=64, precision="bf16")


def by_kind(advice):
    return {s.kind: s for s in advice.suggestions}


def test_a_50257_wide_gemm_wastes_the_padding_of_its_last_tile_and_is_misaligned():
    e = gemm_efficiency(Gemm("head", 8192, 50257, 768), A100)
    assert e.tile == pytest.approx(50257 / 50304)  # 393 tiles of 128 columns, the last one 47 short
    assert e.alignment == A100.unaligned_efficiency  # 50,257 is not a multiple of 8 16-bit elements
    padded = gemm_efficiency(Gemm("head", 8192, 50304, 768), A100)
    assert padded.tile == 1.0 and padded.alignment == 1.0
    assert padded.total > e.total


def test_tiles_just_over_a_wave_multiple_lose_a_wave():
    full = gemm_efficiency(Gemm("x", 108 * 256, 128, 4096), A100)   # 108 tiles on 108 SMs: one full wave
    over = gemm_efficiency(Gemm("x", 109 * 256, 128, 4096), A100)   # 109 tiles: a second wave of one tile
    assert (full.waves, full.wave) == (1, 1.0)
    assert over.waves == 2 and over.wave == pytest.approx(109 / 216)


def test_a_k_that_is_not_a_whole_slab_wastes_the_rest_of_the_slab():
    assert gemm_efficiency(Gemm("x", 256, 128, 96), A100).k == pytest.approx(96 / 128)  # 64-element slabs
    assert gemm_efficiency(Gemm("x", 256, 128, 96), A100, bytes_per_element=4).k == 1.0  # 32-element slabs


def test_gpt2_small_on_8_a100s_is_advised_to_pad_its_vocabulary_with_a_positive_gain():
    for plan in (DP8, TP2):
        pad = by_kind(advise(GPT2, cluster("A100-SXM-80GB"), plan))["vocab_padding"]
        padded = pad.after.model.vocab_size
        assert padded > 50257 and padded % 64 == 0 and padded % plan.tp == 0
        assert pad.change["model.vocab_size"] == {"before": 50257, "after": padded}
        assert pad.gain["step_time"] < 0 and pad.gain["tokens_per_s"] > 0 and pad.gain["mfu"] > 0
        assert pad.recommended and any("⌈V / (128·t)⌉" in line for line in pad.formula)
    assert by_kind(advise(GPT2, cluster("A100-SXM-80GB"), DP8))["vocab_padding"].after.model.vocab_size == 50304


def test_an_aligned_model_gets_no_padding_or_width_suggestion():
    kinds = by_kind(advise(GPT2.replace(vocab_size=50304), cluster("A100-SXM-80GB"), DP8))
    assert "vocab_padding" not in kinds and "width_alignment" not in kinds


def test_moe_against_dense_compares_both_at_equal_active_flops():
    moe = by_kind(advise(GPT2, cluster("A100-SXM-80GB"), DP8))["moe_vs_dense"]
    dense_model, moe_model = moe.before.model, moe.after.model
    assert not dense_model.is_moe and moe_model.is_moe
    assert model_flops_per_token(moe_model) == model_flops_per_token(dense_model)
    for side in ("dense", "moe"):
        figures = moe.details[side]
        assert figures["step_time_s"] > 0 and figures["peak_memory_bytes"] > 0 and figures["tokens_per_s"] > 0
    # the experts' weights cost memory at equal FLOPs
    assert moe.after.peak_memory_bytes > moe.before.peak_memory_bytes
    assert moe.after.parameters > moe.before.parameters


def test_an_moe_model_is_compared_with_its_dense_counterpart():
    moe_model = MODELS["tiny-moe"]
    moe = by_kind(advise(moe_model, local_cpu_cluster(1), ParallelPlan(micro_batch=2, global_batch=4)))
    dense = moe["moe_vs_dense"].after.model
    assert not dense.is_moe and model_flops_per_token(dense) == model_flops_per_token(moe_model)


def test_depth_against_width_keeps_the_parameter_count_within_a_few_percent():
    depth = by_kind(advise(GPT2, cluster("A100-SXM-80GB"), DP8))["depth_vs_width"]
    assert len(depth.alternatives) == 2
    for alt in depth.alternatives:
        assert alt.model.n_layers != GPT2.n_layers
        assert abs(alt.parameters / depth.before.parameters - 1) < 0.05


def test_heads_that_tp_8_cannot_split_are_advised_a_count_it_can():
    heads = by_kind(advise(GPT2, cluster("A100-SXM-80GB"), DP8))["heads_for_tp"]
    assert 8 not in heads.details["tp_allowed_before"] and heads.details["tp_allowed_after"] == [2, 4, 8]
    assert heads.after.model.n_heads % 8 == 0 and GPT2.d_model % heads.after.model.n_heads == 0


def test_micro_batch_and_context_are_judged_against_the_memory_left():
    kinds = by_kind(advise(GPT2, cluster("A100-SXM-80GB"), ParallelPlan(dp=8, micro_batch=1, global_batch=64,
                                                                        precision="bf16")))
    mb = kinds["micro_batch"]
    assert mb.after.plan.micro_batch > 1 and mb.after.fits and mb.gain["tokens_per_s"] > 0
    ctx = kinds["sequence_length"]
    assert ctx.after.fits and ctx.after.model.seq_len > GPT2.seq_len
    assert ctx.after.plan.global_batch * ctx.after.model.seq_len == 64 * GPT2.seq_len


def test_without_a_plan_the_tuners_best_is_advised_on():
    advice = advise(GPT2, cluster("A100-SXM-80GB"))
    assert advice.plan_source == "tuned" and advice.plan.world_size == 8 and advice.baseline.fits
    assert advice.to_dict()["suggestions"]


def test_on_the_cpu_every_figure_is_the_planners_own():
    advice = advise(MODELS["tiny"], local_cpu_cluster(1), ParallelPlan(micro_batch=2, global_batch=4))
    assert not advice.tile_model and advice.baseline.step_time_s == advice.baseline.planner_step_time_s
    for s in advice.suggestions:
        assert s.after.shape_efficiency == 1.0 and s.after.step_time_s == pytest.approx(s.after.planner_step_time_s)


def test_the_pipeline_bubble_follows_a_scaled_compute_term():
    flops_model = EstimateOptions(compute_model="efficiency", compute_efficiency=0.4)
    plan = ParallelPlan(dp=2, tp=2, pp=2, micro_batch=2, global_batch=32, precision="bf16")
    step = Planner(GPT2, cluster("A100-SXM-80GB", 1), flops_model).evaluate(plan).step_time
    parts = step.parts
    compute, work = parts["compute"], sum(parts[k] for k in IN_MICROBATCH if k in parts)
    # compute halved: the bubble (p−1)/(v·m) of a micro-batch's work shrinks as that work does
    assert step.with_compute_scaled(0.5) == pytest.approx(
        step.seconds - compute / 2 - parts["pipeline_bubble"] * compute / 2 / work, rel=1e-12)
    # and is the planner's own step at twice the efficiency
    twice = Planner(GPT2, cluster("A100-SXM-80GB", 1), flops_model.replace(compute_efficiency=0.8))
    assert step.with_compute_scaled(0.5) == pytest.approx(twice.evaluate(plan).step_s, rel=1e-12)


@pytest.mark.parametrize("kwargs, field, number", [
    (dict(plan=ParallelPlan(dp=4, micro_batch=8, global_batch=64)), "plan", "4"),
    (dict(plan=ParallelPlan(dp=8, tp=1, micro_batch=8, global_batch=64), model=GPT2.replace(n_heads=7)),
     "model.n_heads", "7"),
    (dict(global_batch=0), "global_batch", "0"),
])
def test_bad_input_names_the_field_and_the_number(kwargs, field, number):
    model = kwargs.pop("model", GPT2)
    with pytest.raises(SpecError) as info:
        advise(model, cluster("A100-SXM-80GB"), **kwargs)
    assert field in info.value.errors and number in " ".join(info.value.errors[field])


def test_the_command_line_prints_the_table_with_formula_lines(capsys):
    from trainer.planner.advice.__main__ import main

    assert main(["--model", "gpt2-small", "--cluster", "A100-SXM-80GB", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "* vocab_padding" in out and "V' = ⌈V / (128·t)⌉" in out and "tokens/s" in out
    assert main(["--cluster", "V100", "--gpus", "8"]) == 2
    assert "unknown GPU 'V100'" in capsys.readouterr().err


def test_the_gemms_of_a_swiglu_moe_block_are_its_gate_up_and_down_at_each_width():
    from trainer.planner.estimate.gemms import layer_gemms

    model = MODELS["qwen1.5-moe-a2.7b"]
    plan = ParallelPlan(tp=2, micro_batch=1, global_batch=8, precision="bf16")
    widths = {g.name.rsplit(".", 1)[0]: g.n for g in layer_gemms(model, plan, moe=True)
              if g.name.endswith(".forward")}
    assert widths["expert.gate"] == widths["expert.up"] == model.moe_ffn // 2
    assert widths["shared_expert.gate"] == widths["shared_expert.up"] == model.shared_expert_ffn // 2
    dense = {g.name for g in layer_gemms(MODELS["llama3-8b"], plan, moe=False)}
    assert {"mlp.gate.forward", "mlp.up.forward", "mlp.down.forward"} <= dense


def test_an_aligned_swiglu_model_gets_no_width_suggestion():
    from trainer.planner.advice.shapes import aligned_width

    llama = MODELS["tiny-llama"].replace(d_model=256, n_heads=4, n_kv_heads=2, ffn_hidden=0)
    assert llama.ffn == 768  # 8/3·256 rounded up to 256, a multiple of 64
    assert aligned_width(llama, tp=2) is None
    odd = aligned_width(llama.replace(d_model=200, n_heads=4, n_kv_heads=2), tp=1)
    assert odd.d_model == 192 and odd.ffn_hidden == 0 and odd.ffn == 512  # SwiGLU's default at the new width
