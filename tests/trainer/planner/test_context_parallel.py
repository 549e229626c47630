"""The planner under context parallel (docs/formulas.md, Context parallel): a rank's activations are its s/cp
positions' share, the K/V ring per layer is counted and mostly hidden behind attention, the gradient group is dp·cp,
and the tuner reaches for cp on long sequences."""
import math

import pytest

from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS, cluster
from trainer.planner.estimate.comm import rank_of, ring_attention
from trainer.planner.estimate.step_model import RING_GRAD_BYTES
from trainer.planner.estimate import estimate
from trainer.planner.estimate.core import Planner
from trainer.planner.tune import tune
from trainer.planner.tune.space import SearchSpace

LONG = MODELS["llama3-8b"].replace(seq_len=131072)


def test_a_rank_saves_the_activations_of_its_share_of_each_sequence():
    planner = Planner(LONG, cluster(nodes=2))
    base = dict(tp=8, sequence_parallel=True, micro_batch=1, precision="bf16", zero_stage=3)
    whole = planner.stage_memory(ParallelPlan(dp=2, global_batch=2, **base), 0)
    shared = planner.stage_memory(ParallelPlan(cp=2, global_batch=1, **base), 0)
    h, kv = LONG.d_model, LONG.kv_heads * LONG.head_dim
    # the ring keeps keys and values with their K heads (one process repeats them to h first); a share gathers its
    # rotary rows apart for q and for k
    ring = {"qkv": (h + 2 * kv) / (3 * h), "rotary_tables": 2}
    for name, value in whole.activations_per_microbatch.items():
        if value > 1024:  # the scalars (the loss) are the same size on every rank
            assert shared.activations_per_microbatch[name] == pytest.approx(value / 2 * ring.get(name, 1)), name
    # FSDP2 shards over the dp·cp ranks alike: dp2 and cp2 hold the same model state
    assert shared.model_state_bytes == whole.model_state_bytes


def test_the_kv_ring_sends_each_block_round_and_its_gradient_home():
    tokens, h, kv, t, cp, e, bw = 4096, 4096, 1024, 2, 4, 2, 100e9
    ring = ring_attention(tokens, h, kv, t, cp, e, bw, flops_per_s=1e14)
    kv_block, grad_block = 2 * tokens * kv / t * e, 2 * tokens * kv / t * RING_GRAD_BYTES
    assert ring.sent_bytes == 2 * (cp - 1) * kv_block + cp * grad_block
    assert ring.hops == 3 * (cp - 1) + 1
    # a hop shorter than the attention it overlaps costs nothing; only the last gradient hop home stays
    assert ring.exposed_s == grad_block / bw < ring.transfer_s
    slow = ring_attention(tokens, h, kv, t, cp, e, bw, flops_per_s=1e18)  # attention too fast to hide anything
    assert abs(slow.exposed_s - slow.transfer_s) < 1e-3 * slow.transfer_s
    recompute = ring_attention(tokens, h, kv, t, cp, e, bw, 1e14, full_recompute=True)
    assert recompute.sent_bytes == ring.sent_bytes + (cp - 1) * kv_block
    assert ring_attention(tokens, h, kv, t, 1, e, bw, 1e15).sent_bytes == 0


def test_the_step_counts_the_ring_and_averages_gradients_over_dp_and_cp():
    planner = Planner(LONG, cluster(nodes=2))
    plan = ParallelPlan(cp=2, dp=1, tp=8, sequence_parallel=True, micro_batch=1, global_batch=1, precision="bf16",
                        zero_stage=3, activation_checkpointing="full")
    numbers = planner.evaluate(plan)
    step = numbers.step_time
    assert step.parts["context_parallel"] > 0
    assert step.collectives.calls["cp"] == 32 * 5  # layers × hops (full recompute: the forward ring twice)
    assert "data_parallel" in step.parts  # dp=1, but the two cp ranks average their gradients
    one = planner.evaluate(plan.replace(cp=1, dp=1))
    assert step.parts["compute"] < one.step_time.parts["compute"] / 1.9


def test_ranks_are_laid_out_with_cp_between_dp_and_tp():
    plan = ParallelPlan(pp=2, dp=2, cp=2, tp=2, global_batch=2)
    assert [rank_of(plan, 0, 0, j, c) for c in range(2) for j in range(2)] == [0, 1, 2, 3]
    assert rank_of(plan, 0, 1, 0, 0) == 4 and rank_of(plan, 1, 0, 0, 0) == 8


def test_the_tuner_splits_a_long_sequence_over_context_parallel_ranks():
    result = tune(LONG, cluster(nodes=2), 16, top_k=3)
    assert result.ranked[0].plan.cp > 1
    without = tune(LONG, cluster(nodes=2), 16, top_k=3, space=SearchSpace(cp_from_seq_len=10 ** 9))
    assert all(r.plan.cp == 1 for r in without.ranked)
    assert result.ranked[0].step_time_s < without.ranked[0].step_time_s
    short = tune(MODELS["llama3-8b"], cluster(nodes=2), 16, top_k=3)
    assert all(r.plan.cp == 1 for r in short.ranked)  # 8 K tokens: cp is not searched


def test_every_figure_of_a_context_parallel_estimate_follows_from_its_terms():
    from tests.trainer.planner.test_figure_formulas import REL_TOL, estimate_figures, evaluate

    plans = [ParallelPlan(cp=8, tp=2, global_batch=16, micro_batch=1, precision="bf16", zero_stage=3),
             ParallelPlan(cp=4, dp=2, tp=2, sequence_parallel=True, global_batch=16, micro_batch=1,
                          precision="bf16", activation_checkpointing="full"),
             ParallelPlan(cp=2, pp=2, dp=2, tp=2, global_batch=16, micro_batch=1, precision="bf16",
                          activation_checkpointing="selective")]
    for plan in plans:
        est = estimate(LONG, plan, cluster(nodes=2))
        assert est.time["step"].terms["context_parallel"].value > 0
        for path, f in estimate_figures(est):
            assert math.isclose(evaluate(f.formula, f.terms), f.value, rel_tol=REL_TOL, abs_tol=1e-12), path
