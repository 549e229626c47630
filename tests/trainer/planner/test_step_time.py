"""FLOPs, communication, bubble, step time, MFU, budget and inference figures."""
import json

import pytest

from trainer.planner.estimate import estimate, inference_estimate
from trainer.planner.estimate import flops as F
from trainer.planner.estimate.core import Planner, ring_all_reduce_s, ring_gather_s
from trainer.planner.estimate.figure import Figure, walk
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.params import count
from trainer.contract.presets import MODELS, cluster
from trainer.contract import ParallelPlan

GPT3 = MODELS["gpt3-175b"]
MEGATRON_PLAN = ParallelPlan(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, sequence_parallel=True,
                             precision="bf16", activation_checkpointing="selective",
                             pipeline_schedule="interleaved", virtual_stages=3)


def test_it_counts_model_flops_as_palm_and_narayanan_do():
    m = GPT3
    assert F.model_flops_per_token(m) == 6 * count(m).matmul_per_token + 12 * m.n_layers * m.d_model * m.seq_len
    B = 1536
    assert F.model_flops_per_token(m) * B * m.seq_len == pytest.approx(F.narayanan_flops_per_step(m, B, False),
                                                                       rel=1e-12)
    full = (F.model_flops_per_token(m) + F.recompute_flops_per_token(m, "full")) * B * m.seq_len
    assert full == pytest.approx(F.narayanan_flops_per_step(m, B, True), rel=1e-12)


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
    work = one["compute"] + one["tensor_parallel"]
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
    est = estimate(GPT3, MEGATRON_PLAN, cluster("A100-SXM-80GB", 128))
    assert 0.35 < est.time["mfu"].value < 0.55  # Narayanan 2021: 44–52 % of peak on A100
    assert est.fits


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


def test_it_agrees_with_the_tuners_fast_path():
    c = cluster("A100-SXM-80GB", 4)
    p = Planner(MODELS["gpt2-xl"], c)
    from trainer.planner.tune.space import enumerate_plans
    plans = list(enumerate_plans(MODELS["gpt2-xl"], c, 64))[::3]
    assert len(plans) > 100
    for plan in plans:
        n = p.evaluate(plan)
        step, peak, stage, flops, _, _ = p.quick(plan)
        assert step == pytest.approx(n.step_s, rel=1e-12) and peak == pytest.approx(n.peak_bytes, rel=1e-12)
        assert stage == n.peak_stage and flops == n.model_flops_per_step


def test_it_bounds_decode_time_by_memory_bandwidth():
    m, c = MODELS["mixtral-like-8x7b"], cluster("H100-SXM", 1)
    inf = inference_estimate(m, c, tp=2, batch=4, context=4096)
    per_token = 2 * m.n_layers * m.kv_heads * m.head_dim * 2
    assert inf["kv_per_token"].value == per_token == 131072
    assert inf["kv_cache"].value == per_token * 4 * 4096
    weights_gpu = count(m).total * 2 / 2
    expected = (weights_gpu + per_token * 4 * 4096 / 2) / (c.gpu.memory_bandwidth_gbs * 1e9)
    assert inf["decode_time_per_token"].value == pytest.approx(expected)
    assert json.dumps(inf.to_dict())


def test_it_paces_a_pipeline_by_its_last_stage_which_holds_the_head():
    m, c = MODELS["gpt2-medium"], cluster("A100-SXM-80GB", 1)
    opts = EstimateOptions(efficiency_half_work=0.0)  # efficiency = compute_efficiency exactly
    p = Planner(m, c, opts)
    flat = p.evaluate(ParallelPlan(dp=8, micro_batch=1, global_batch=64, precision="bf16")).time["compute"]
    piped = p.evaluate(ParallelPlan(dp=2, pp=4, micro_batch=1, global_batch=64, precision="bf16")).time["compute"]
    tokens, peak = 64 * m.seq_len, 312e12 * 0.5
    head = 6 * m.vocab_size * m.d_model
    blocks = F.model_flops_per_token(m) - head
    assert flat == pytest.approx(tokens / 8 * (blocks + head) / peak)
    assert piped == pytest.approx(tokens / 2 * (blocks / 4 + head) / peak)
    assert piped > flat  # the head makes the last stage the slowest


def _calls(model, plan, clu=None):
    n = Planner(model, clu or cluster("A100-SXM-80GB", 1)).evaluate(plan)
    return n.collectives, n.latency_hops


def test_it_counts_tensor_parallel_collectives_per_layer_per_micro_batch_by_hand():
    tiny = MODELS["tiny"]  # 4 layers
    # m = 2 micro-batches · (4 layers · 4 all-reduces + 2 at the embedding and head) = 36 all-reduces of 2·(2−1)
    # ring steps each
    calls, hops = _calls(tiny, ParallelPlan(tp=2, micro_batch=2, global_batch=4))
    assert calls == {"tp": 36} and hops == {"tp": 72}
    # sequence parallel: each all-reduce becomes an all-gather + a reduce-scatter of 2−1 steps: 72 calls, 72 hops
    calls, hops = _calls(tiny, ParallelPlan(tp=2, micro_batch=2, global_batch=4, sequence_parallel=True))
    assert calls == {"tp": 72} and hops == {"tp": 72}
    # full recompute runs each forward twice: 1 · (4·6 + 2) = 26 all-reduces; t = 4: 2·3 steps each
    calls, hops = _calls(tiny, ParallelPlan(tp=4, micro_batch=4, global_batch=4, activation_checkpointing="full"))
    assert calls == {"tp": 26} and hops == {"tp": 26 * 6}


def test_it_counts_pipeline_messages_and_data_parallel_collectives_by_hand():
    tiny = MODELS["tiny"]
    # interleaved, v = 2, m = 4: an activation forward and a gradient back per micro-batch per chunk: 16 messages
    calls, hops = _calls(tiny, ParallelPlan(pp=2, micro_batch=1, global_batch=4, pipeline_schedule="interleaved",
                                            virtual_stages=2))
    assert calls == hops == {"pp": 16}
    # FSDP2, 4 blocks + the root = 5 units, m = 2: 2·(5 forward + 4 backward re-gathers) + 5 reduce-scatters = 23
    calls, hops = _calls(tiny, ParallelPlan(dp=2, micro_batch=4, global_batch=16, zero_stage=3))
    assert calls == hops == {"dp": 23}
    # dp = 4, m = 1: 9 + 5 = 14 collectives of 4−1 steps
    calls, hops = _calls(tiny, ParallelPlan(dp=4, micro_batch=4, global_batch=16, zero_stage=3))
    assert calls == {"dp": 14} and hops == {"dp": 42}
    # a pipeline keeps FSDP blocks gathered from forward to backward: 2 stages of 2 blocks + root, m = 2:
    # 2·3 all-gathers + 3 reduce-scatters; interleaved v = 2: two chunks of one block + a root each, m = 4:
    # 4·4 + 4
    calls, _ = _calls(tiny, ParallelPlan(dp=2, pp=2, micro_batch=2, global_batch=8, zero_stage=3))
    assert calls == {"pp": 4, "dp": 9}
    calls, _ = _calls(tiny, ParallelPlan(dp=2, pp=2, micro_batch=1, global_batch=8, zero_stage=3,
                                         pipeline_schedule="interleaved", virtual_stages=2))
    assert calls == {"pp": 16, "dp": 20}
    # DDP with tp or pp: the trainer's one flat all-reduce after backward
    calls, hops = _calls(tiny, ParallelPlan(dp=2, pp=2, micro_batch=4, global_batch=16))
    assert calls == {"pp": 4, "dp": 1} and hops == {"pp": 4, "dp": 2}
    # DDP buckets of 25 MiB: GPT-2 XL, 1,557,611,200 parameters, fp32 gradients (native bf16 keeps fp32 grads):
    # ⌈6,230,444,800 / 26,214,400⌉ = 238 all-reduces of 2·7 steps
    calls, hops = _calls(MODELS["gpt2-xl"], ParallelPlan(dp=8, micro_batch=1, global_batch=8, precision="bf16"))
    assert calls == {"dp": 238} and hops == {"dp": 238 * 14}


def test_it_counts_expert_all_to_alls_by_hand():
    moe = MODELS["tiny-moe"]  # 4 layers, every 2nd an MoE layer: 2 MoE layers
    calls, hops = _calls(moe, ParallelPlan(dp=4, ep=4, micro_batch=2, global_batch=16))
    # m = 2 · 2 MoE layers · 4 all-to-alls (dispatch, combine; forward, backward) of 4−1 steps; DDP: 1 bucket
    assert calls == {"ep": 16, "dp": 1} and hops == {"ep": 48, "dp": 6}


def test_it_adds_alpha_per_latency_hop_to_each_communication_term():
    tiny, c = MODELS["tiny"], cluster("A100-SXM-80GB", 1)
    plan = ParallelPlan(dp=2, tp=2, pp=2, micro_batch=1, global_batch=8, sequence_parallel=True)
    a = 1e-3
    with_a = Planner(tiny, c, EstimateOptions(collective_latency_s=a)).evaluate(plan)
    without = Planner(tiny, c, EstimateOptions(collective_latency_s=0.0)).evaluate(plan)
    hops = with_a.latency_hops
    # m = 4, 2 layers a stage: tp 4·(2·4 + 1 edge) all-reduces · 2·(2−1); pp 4·2 messages; dp one flat
    # all-reduce of 2·(2−1) steps
    assert hops == {"tp": 72, "pp": 8, "dp": 2}
    for name, key in (("tensor_parallel", "tp"), ("pipeline_p2p", "pp"), ("data_parallel", "dp")):
        assert with_a.time[name] - without.time[name] == pytest.approx(a * hops[key])
    # tp collectives run inside each micro-batch's work, which the bubble stretches by (p−1)/m
    assert with_a.time["pipeline_bubble"] - without.time["pipeline_bubble"] == pytest.approx(a * 72 / 4)
    est = estimate(tiny, plan, c, EstimateOptions(collective_latency_s=a))
    lat = est.time["step"].terms["tensor_parallel"].terms["latency_s"]
    assert lat.value == pytest.approx(a * 72) and "α" in lat.formula


def test_it_defaults_alpha_to_a_gpu_cluster_collective_latency():
    assert 1e-6 <= EstimateOptions().collective_latency_s <= 1e-5  # NVLink a few µs, InfiniBand 5–10 µs
    with pytest.raises(Exception, match="collective_latency_s"):
        EstimateOptions(collective_latency_s=-1.0).validate()
