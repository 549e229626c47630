"""The planner under uneven pipeline stages: each stage's parameters and memory from its own layers, the slowest
stage setting the pace, the largest stage deciding fit, and the tuner's lighter first and last stages (Llama 3 405B's
126 layers on pp = 16 as 7, fourteen stages of 8, 7)."""
from __future__ import annotations

import pytest

from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS, cluster
from trainer.contract.stages import stage_layer_counts
from trainer.planner.estimate import estimate
from trainer.planner.estimate import memory as M
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.params import count, embedding_tensors, final_tensors, rank_params
from trainer.planner.estimate.render import render_estimate
from trainer.planner.schedule import schedule_orders, simulate, stage_weights
from trainer.planner.tune.search import rank_plans
from trainer.planner.tune.space import SearchSpace, enumerate_plans, lighter_ends

# Llama 3 405B's shape (Dubey et al. 2024, table 3)
LLAMA_405B = MODELS["tiny-llama"].replace(name="llama-3-405b-shape", n_layers=126, d_model=16384, n_heads=128,
                                          n_kv_heads=8, ffn_hidden=53248, seq_len=8192, vocab_size=128256,
                                          rope_scaling=None)
MEGATRON_405B = (7,) + (8,) * 14 + (7,)
TINY5 = MODELS["tiny-llama"].replace(n_layers=5)


def _sum(tensors) -> int:
    return sum(t.numel for t in tensors)


@pytest.mark.parametrize("plan", [
    ParallelPlan(pp=16, global_batch=16, first_stage_layers=7, last_stage_layers=7),
    ParallelPlan(pp=4, global_batch=16, tp=2, stage_layers=(40, 30, 30, 26)),
], ids=["megatron-7-8x14-7", "given-40-30-30-26"])
def test_each_stage_holds_the_parameters_of_its_own_layers(plan):
    m, block = LLAMA_405B, count(LLAMA_405B).per_dense_block
    planner = Planner(m, cluster("H100-SXM", plan.world_size // 8 or 1))
    counts = stage_layer_counts(m.n_layers, plan)
    numbers = planner.evaluate(plan)
    assert [st.layers for st in numbers.stages] == list(counts)  # every stage shown, with its layers
    one_layer = rank_params(m, plan.tp, m.n_layers, 1, 1)  # a rank's share of one layer: a middle stage of one
    first_extra = rank_params(m, plan.tp, m.n_layers, 1, 0) - one_layer  # the embedding's share
    last_extra = rank_params(m, plan.tp, m.n_layers, 1, m.n_layers - 1) - one_layer  # the final norm's and head's
    for st in numbers.stages:
        assert st.params == counts[st.stage] * one_layer + (first_extra if st.stage == 0 else 0) + \
            (last_extra if st.stage == plan.pp - 1 else 0)
    if plan.tp == 1:
        assert one_layer == block and first_extra == _sum(embedding_tensors(m))
        assert last_extra == _sum(final_tensors(m, True))
        assert sum(st.params for st in numbers.stages) == count(m).total  # untied: nothing held twice


def test_each_stage_saves_the_activations_of_its_own_layers():
    plan = ParallelPlan(pp=2, virtual_stages=2, pipeline_schedule="interleaved", micro_batch=2, global_batch=8,
                        stage_layers=(2, 1, 1, 1))
    planner = Planner(TINY5, cluster("H100-SXM", 1, gpus_per_node=2))
    settings = planner.activation_settings(plan)
    per_layer = sum(v for _, v in M.layer_activations(planner.layer_shape(False), settings))
    for stage, layers in ((0, 3), (1, 2)):  # rank 0: stages 0 and 2 (layers 0, 1 and 3); rank 1: layers 2 and 4
        st = planner.stage_memory(plan, stage)
        edges = sum(v for _, v in M.edge_activations(TINY5, settings, stage == 0, stage == 1))
        assert st.layers == layers
        assert sum(st.activations_per_microbatch.values()) == pytest.approx(layers * per_layer + edges)
    est = estimate(TINY5, plan, planner.cluster)
    assert [s["layers"] for s in est.memory["stages"]] == [[[0, 1], [3, 3]], [[2, 2], [4, 4]]]
    text = render_estimate(est)
    assert "stage_layers=[2, 1, 1, 1]" in text and "pipeline stage 0 (rank 0, layers 0–1, 3)" in text


def test_the_slowest_stage_sets_the_pace():
    even = ParallelPlan(pp=2, micro_batch=1, global_batch=8)
    planner = Planner(MODELS["tiny-llama"], cluster("H100-SXM", 1, gpus_per_node=2),
                      EstimateOptions(compute_model="efficiency"))  # compute in proportion to FLOPs
    F_b, F_h = planner.block_flops["none"], planner.head_flops_per_token
    base = planner.evaluate(even).time
    # (3, 1): the first rank's three layers outweigh the last's one layer and head only when 3/4·F_b > F_b/4 + F_h
    for layout in ((1, 3), (3, 1)):
        plan = even.replace(stage_layers=layout)
        slowest = max(layout[0] / 4 * F_b, layout[1] / 4 * F_b + F_h)
        time = planner.evaluate(plan).time
        assert time["compute"] / base["compute"] == pytest.approx(slowest / (F_b / 2 + F_h))
        assert time["pipeline_bubble"] > base["pipeline_bubble"]  # the fill and drain run at the slowest's pace
        assert planner.quick(plan).step_s == pytest.approx(planner.evaluate(plan).step_s)
    assert planner.pace(even.replace(stage_layers=(1, 3)))[0] == 1


def test_the_largest_stage_decides_fit():
    """Under 1F1B the first rank holds the most micro-batches; with 7 layers against 8 the second rank's may be the
    larger memory. The tuner's fast path and the full estimate agree on which and how much."""
    plan = ParallelPlan(pp=16, tp=8, micro_batch=1, global_batch=64, precision="bf16", sequence_parallel=True,
                        activation_checkpointing="selective", first_stage_layers=7, last_stage_layers=7)
    planner = Planner(LLAMA_405B, cluster("H100-SXM", 16))
    numbers, quick = planner.evaluate(plan), planner.quick(plan)
    largest = max(numbers.stages, key=lambda st: st.total)
    assert (quick.peak_bytes, quick.peak_stage) == (pytest.approx(largest.total), largest.stage)
    assert numbers.peak_bytes == largest.total
    assert {0, 1, 14, 15} >= set(planner.memory_ranks(plan))  # the other middle stages hold less in flight


def test_lighter_ends_follow_megatron():
    assert lighter_ends(126, 16) == (7, 7)
    assert lighter_ends(3, 2) == (2, 1)         # the last stage, with the head, the lighter
    assert lighter_ends(128, 16) is None        # even
    assert lighter_ends(17, 16) is None         # no layer left for the ends
    for layers, stages in ((126, 32), (6, 4), (61, 8)):
        first, last = lighter_ends(layers, stages)
        counts = stage_layer_counts(layers, ParallelPlan(pp=stages, global_batch=stages, first_stage_layers=first,
                                                         last_stage_layers=last))
        assert sum(counts) == layers and max(first, last) <= counts[1]


def test_the_tuner_plans_llama_405b_on_sixteen_stages():
    space = SearchSpace(precisions=("bf16",), engines=("native", "deepspeed"), checkpointing=("full",),
                        micro_batches=(1,), schedules=("1f1b",), sequence_parallel=(True,))
    clu = cluster("H100-SXM", 128)
    pp16 = [p for p in enumerate_plans(LLAMA_405B, clu, 1024, space) if p.pp == 16]
    assert pp16 and all(stage_layer_counts(126, p) == MEGATRON_405B for p in pp16)
    assert all(p.engine == "native" for p in pp16)  # DeepSpeed's pipeline takes no layout
    ranked = [c for c in rank_plans(LLAMA_405B, clu, 1024, space).ranked if c.plan.pp == 16]
    assert ranked, "no fitting plan with pp=16"


def test_deepspeed_refuses_an_uneven_layout():
    plan = ParallelPlan(pp=2, global_batch=4, engine="deepspeed", zero_stage=1, stage_layers=(2, 1))
    assert "takes no layout" in plan.problems()["stage_layers"][0]
    assert not plan.replace(engine="native", zero_stage=0).problems()


@pytest.mark.parametrize("model,plan,nodes,gpus_per_node", [
    (LLAMA_405B, ParallelPlan(pp=16, tp=8, dp=8, micro_batch=1, global_batch=256, precision="bf16", zero_stage=3,
                              sequence_parallel=True, activation_checkpointing="full", first_stage_layers=7,
                              last_stage_layers=7), 128, 8),
    (TINY5, ParallelPlan(pp=2, virtual_stages=2, pipeline_schedule="zbv", micro_batch=2, global_batch=8,
                         stage_layers=(2, 1, 1, 1)), 1, 2),
    (TINY5, ParallelPlan(pp=2, dp=2, micro_batch=2, global_batch=8, stage_layers=(1, 4)), 1, 4),
], ids=["405b-megatron", "zbv-2-1-1-1", "dp2-1-4"])
def test_every_figure_of_an_uneven_estimate_follows_from_its_terms(model, plan, nodes, gpus_per_node):
    from tests.trainer.planner.test_figure_formulas import REL_TOL, estimate_figures, evaluate

    est = estimate(model, plan, cluster("H100-SXM", nodes, gpus_per_node=gpus_per_node))
    assert len(est.memory["stages"]) == plan.pp  # every rank, with its layers
    checked = 0
    for path, f in estimate_figures(est):
        if f.formula and f.terms:
            assert evaluate(f.formula, f.terms) == pytest.approx(f.value, rel=REL_TOL, abs=1e-12), path
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("kind,pp,m,v,counts", [
    ("1f1b", 2, 4, 1, (2, 1)), ("1f1b", 4, 8, 1, (7, 8, 8, 7)), ("gpipe", 2, 4, 1, (1, 2)),
    ("interleaved", 2, 4, 2, (2, 1, 1, 1)), ("interleaved", 4, 8, 2, (3, 4, 4, 4, 4, 4, 4, 3)),
])
def test_pacing_by_the_slowest_rank_bounds_the_ideal_schedule(kind, pp, m, v, counts):
    """The planner's step, m micro-batches of the slowest rank's work stretched by the bubble (p − 1)/(v·m), laid
    beside the ideal schedule with each stage's actions costing its layers: never below it, and equal to it when
    the stages are equal."""
    orders = schedule_orders(kind, pp, m, v)
    weights = stage_weights(counts)
    rank_work = [3 * sum(weights[s] for s in range(r, pp * v, pp)) for r in range(pp)]  # F + B: 3 units a stage
    planned = max(rank_work) * m * (1 + (pp - 1) / (v * m))
    assert simulate(orders, stage_costs=weights).makespan <= planned + 1e-9
    assert simulate(orders).makespan == pytest.approx(3 * v * m * (1 + (pp - 1) / (v * m)))
