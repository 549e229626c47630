"""Collectives and latency hops per step, counted by hand, and the α of the α–β model."""
import pytest

from trainer.planner.estimate import estimate
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract.presets import MODELS, cluster
from trainer.contract import ParallelPlan


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


def test_megatron_scatters_a_pipeline_activation_over_its_tensor_parallel_ranks_and_gathers_it_over_the_node():
    tiny = MODELS["tiny"]  # 4 layers, h 64, s 64
    clu = cluster("A100-SXM-80GB", 2, inter_node_bandwidth_gbs=25.0)
    plan = dict(tp=8, pp=2, micro_batch=1, global_batch=2, precision="bf16")  # stages on two nodes, m = 2
    native = Planner(tiny, clu).evaluate(ParallelPlan(**plan))
    megatron = Planner(tiny, clu).evaluate(ParallelPlan(**plan, engine="megatron"))
    # each activation and gradient, T·h·e = 64·64·2 bytes: whole over the network, or an eighth over the network
    # and seven eighths gathered over NVLink
    message = 64 * 64 * 2
    inter, intra = 25e9 * 0.8, Planner(tiny, clu).bandwidths(ParallelPlan(**plan))["tp"]

    def bytes_s(numbers) -> float:  # the part without the latency
        term, args = numbers.step_time.terms["latency_pp"]
        return numbers.time["pipeline_p2p"] - term.function(*args)
    assert bytes_s(native) == pytest.approx(2 * 2 * message / inter)
    assert bytes_s(megatron) == pytest.approx(2 * 2 * (message / 8 / inter + 7 / 8 * message / intra))
    # the gathers are tensor-parallel collectives: m · v · 2 more, of 8 − 1 ring steps
    assert megatron.collectives["tp"] - native.collectives["tp"] == 4
    assert megatron.latency_hops["tp"] - native.latency_hops["tp"] == 4 * 7
    # under sequence parallel the activation is sharded already: nothing to gather
    sp = dict(plan, sequence_parallel=True)
    assert (Planner(tiny, clu).evaluate(ParallelPlan(**sp, engine="megatron")).time["pipeline_p2p"]
            == pytest.approx(Planner(tiny, clu).evaluate(ParallelPlan(**sp)).time["pipeline_p2p"]))


@pytest.mark.parametrize("tp, rings", [(1, 8), (2, 4), (8, 1)])
def test_a_ring_over_nodes_runs_as_many_rings_as_the_group_has_ranks_on_a_node(tp, rings):
    """The data-parallel group of 32 ranks on four nodes of 8 GPUs at 25 GB/s a GPU: 8, 4 or 1 of its ranks on each
    node, each ring leaving the node through its own adapter; at most the node's NVLink figure (300 GB/s)."""
    clu = cluster("A100-SXM-80GB", 4 * tp, inter_node_bandwidth_gbs=25.0)
    planner = Planner(MODELS["tiny"], clu)
    plan = ParallelPlan(tp=tp, dp=32, micro_batch=1, global_batch=32)
    bandwidths = planner.bandwidths(plan)
    assert bandwidths["dp"] == pytest.approx(min(rings * 25e9, clu.intra_node_bandwidth_gbs * 1e9) * 0.8)
    # an all-to-all or a pipeline message leaves each rank through its own adapter, whatever the group
    assert planner.bandwidths(ParallelPlan(tp=tp, pp=32, micro_batch=1, global_batch=32))["pp"] == pytest.approx(
        25e9 * 0.8)
