"""Step time: compute at the slowest stage, ring collectives, bandwidth by placement, the bubble, ZeRO-3 volume, MFU."""
import pytest

from trainer.planner.estimate import estimate
from trainer.planner.estimate import flops as F
from trainer.planner.estimate.core import Planner, ring_all_reduce_s, ring_gather_s
from trainer.planner.estimate.numbers import IN_MICROBATCH
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract.presets import MODELS, cluster
from trainer.contract import ParallelPlan

GPT3 = MODELS["gpt3-175b"]
MEGATRON_PLAN = ParallelPlan(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, sequence_parallel=True,
                             precision="bf16", activation_checkpointing="selective",
                             pipeline_schedule="interleaved", virtual_stages=3)


def test_it_uses_ring_formulas():
    assert ring_all_reduce_s(8e9, 8, 1e9) == pytest.approx(2 * 7 / 8 * 8)
    assert ring_gather_s(8e9, 8, 1e9) == pytest.approx(7 / 8 * 8)
    assert ring_all_reduce_s(8e9, 1, 1e9) == 0


def test_it_charges_four_tensor_parallel_all_reduces_per_layer_per_micro_batch():
    c = cluster("A100-SXM-80GB", 1)
    opts = EstimateOptions(comm_efficiency=1.0, collective_latency_s=0.0)  # the bandwidth term alone
    plan = ParallelPlan(dp=1, tp=8, micro_batch=2, global_batch=6, precision="bf16")
    m = MODELS["gpt2-large"]
    t = Planner(m, c, opts).evaluate(plan).time
    one = 2 * 7 / 8 * (m.seq_len * 2 * m.d_model * 2) / (c.intra_node_bandwidth_gbs * 1e9)
    assert t["tensor_parallel"] == pytest.approx(3 * m.n_layers * 4 * one)


def test_it_uses_intra_node_bandwidth_only_for_groups_inside_a_node():
    c = cluster("A100-SXM-80GB", 4)
    p = Planner(MODELS["gpt2-xl"], c)
    inside = p.evaluate(ParallelPlan(dp=4, tp=8, micro_batch=1, global_batch=32, precision="bf16")).bandwidths
    assert inside["tp"] > inside["dp"]  # tp in the node, dp across nodes
    single = Planner(MODELS["gpt2-xl"], cluster("A100-SXM-80GB", 1)).evaluate(
        ParallelPlan(dp=8, micro_batch=1, global_batch=32, precision="bf16")).bandwidths
    assert single["dp"] == inside["tp"]


def test_it_adds_the_pipeline_bubble_as_p_minus_1_over_m_and_v():
    c = cluster("A100-SXM-80GB", 16)
    p = Planner(GPT3, c)
    base = dict(dp=8, tp=8, pp=2, micro_batch=1, global_batch=64, precision="bf16")
    one = p.evaluate(ParallelPlan(**base, pipeline_schedule="1f1b")).time
    inter = p.evaluate(ParallelPlan(**base, pipeline_schedule="interleaved", virtual_stages=4)).time
    work = sum(one[k] for k in IN_MICROBATCH if k in one)   # compute, tensor parallel, gradient accumulation
    assert "gradient_accumulation" in one
    assert one["pipeline_bubble"] == pytest.approx(work * 1 / 8)
    assert inter["pipeline_bubble"] == pytest.approx(work * 1 / (4 * 8))


def test_it_moves_one_and_a_half_times_the_all_reduce_volume_under_zero3_with_one_micro_batch():
    c = cluster("A100-SXM-80GB", 1)
    m = MODELS["gpt2-medium"]
    p = Planner(m, c, EstimateOptions(collective_latency_s=0.0))  # volume: the bandwidth term alone
    z0 = p.evaluate(ParallelPlan(dp=8, micro_batch=1, global_batch=8, engine="deepspeed", zero_stage=0,
                                 precision="bf16")).time["data_parallel"]
    z3 = p.evaluate(ParallelPlan(dp=8, micro_batch=1, global_batch=8, engine="deepspeed", zero_stage=3,
                                 precision="bf16")).time["data_parallel"]
    assert z3 == pytest.approx(1.5 * z0)


def test_it_estimates_gpt3_175b_mfu_in_the_published_range():
    # Korthikanti et al. 2022 measured 51.4 % MFU for GPT-3 175B with sequence parallel and selective recompute on
    # A100s, with Megatron-LM's overlapped communication (bench.trainer.planner.published plans that run); the native
    # engine's plan at default options overlaps none of it, and lands lower, within the 40-56 % published runs of this
    # size reach
    est = estimate(GPT3, MEGATRON_PLAN, cluster("A100-SXM-80GB", 128))
    assert 0.40 < est.time["mfu"].value < 0.514
    assert est.fits


def test_it_agrees_with_the_tuners_fast_path():
    c = cluster("A100-SXM-80GB", 4)
    p = Planner(MODELS["gpt2-xl"], c)
    from trainer.planner.tune.space import enumerate_plans
    plans = list(enumerate_plans(MODELS["gpt2-xl"], c, 64))[::3]
    assert len(plans) > 100
    for plan in plans:
        n = p.evaluate(plan)
        q = p.quick(plan)
        step, peak, stage, flops = q.step_s, q.peak_bytes, q.peak_stage, q.model_flops_per_step
        assert step == pytest.approx(n.step_s, rel=1e-12) and peak == pytest.approx(n.peak_bytes, rel=1e-12)
        assert stage == n.peak_stage and flops == n.model_flops_per_step


def test_it_paces_a_pipeline_by_its_last_stage_which_holds_the_head():
    m, c = MODELS["gpt2-medium"], cluster("A100-SXM-80GB", 1)
    # the FLOPs model, efficiency = compute_efficiency exactly
    opts = EstimateOptions(compute_model="efficiency", efficiency_half_work=0.0)
    p = Planner(m, c, opts)
    flat = p.evaluate(ParallelPlan(dp=8, micro_batch=1, global_batch=64, precision="bf16")).time["compute"]
    piped = p.evaluate(ParallelPlan(dp=2, pp=4, micro_batch=1, global_batch=64, precision="bf16")).time["compute"]
    tokens, peak = 64 * m.seq_len, 312e12 * 0.5
    head = 6 * m.vocab_size * m.d_model
    blocks = F.model_flops_per_token(m) - head
    assert flat == pytest.approx(tokens / 8 * (blocks + head) / peak)
    assert piped == pytest.approx(tokens / 2 * (blocks / 4 + head) / peak)
    assert piped > flat  # the head makes the last stage the slowest
