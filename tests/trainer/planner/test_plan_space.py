"""The tuner's inline validity rules agree with ParallelPlan.problems() and rules.check_plan on whole grids."""
import itertools
from typing import get_args

import pytest

from trainer.contract.presets import MODELS, cluster
from trainer.contract import ModelSpec, ParallelPlan, check_plan
from trainer.contract.schedules import Schedule
from trainer.planner.tune.space import SearchSpace, divisors, enumerate_plans, lighter_ends

SPACE = SearchSpace(precisions=("fp32", "bf16", "fp16"), checkpointing=("none", "full"), max_micro_batch=1 << 20,
                    max_virtual_stages=3)
GQA = ModelSpec(n_layers=6, d_model=64, n_heads=4, n_kv_heads=2, seq_len=30, vocab_size=100, name="gqa")
# 6 experts (ep = 4 does not divide them), top-1 on every layer, spread over two nodes
MOE_E6 = ModelSpec(n_layers=2, d_model=64, n_heads=4, seq_len=32, vocab_size=100, n_experts=6, top_k=1, moe_every=1,
                   capacity_factor=1.5, name="moe-e6")


def _raw_grid(model, clu, global_batch):
    """Every combination of field values, valid or not, in the same value ranges as SPACE."""
    world = clu.world_size
    for tp, pp in itertools.product(divisors(world), repeat=2):
        if world % (tp * pp):
            continue
        dp = world // (tp * pp)
        for b, sp, ep, engine, zero, off_o, off_p, ckpt, prec, sched, v in itertools.product(
                divisors(global_batch), (False, True), divisors(dp), ("native", "deepspeed"), (0, 1, 2, 3),
                (False, True), (False, True), SPACE.checkpointing, SPACE.precisions,
                get_args(Schedule), range(1, SPACE.max_virtual_stages + 1)):
            plan = ParallelPlan(dp=dp, tp=tp, pp=pp, micro_batch=b, global_batch=global_batch, sequence_parallel=sp,
                                ep=ep, engine=engine, zero_stage=zero, offload_optimizer=off_o, offload_params=off_p,
                                activation_checkpointing=ckpt, precision=prec, pipeline_schedule=sched,
                                virtual_stages=v)
            yield plan
            ends = lighter_ends(model.n_layers, pp * plan.model_chunks)  # the uneven layout the tuner tries
            if ends:
                yield plan.replace(first_stage_layers=ends[0], last_stage_layers=ends[1])


def _spec_valid(model, clu, global_batch):
    valid = set()
    for plan in _raw_grid(model, clu, global_batch):
        if any(plan.problems().values()) or any(check_plan(model, plan, clu).values()):
            continue
        if plan.pp == 1:  # the schedule does nothing without a pipeline: the tuner keeps one of them
            if plan.virtual_stages > 1:
                continue
            plan = plan.replace(pipeline_schedule="1f1b")
        valid.add(plan)
    return valid


@pytest.mark.parametrize("model,clu,global_batch", [
    (MODELS["tiny"], cluster("A100-SXM-80GB", 1, gpus_per_node=4), 8),
    (MODELS["tiny-moe"], cluster("A100-SXM-80GB", 1, gpus_per_node=4), 8),
    (GQA, cluster("A100-SXM-80GB", 2, gpus_per_node=2), 6),
    (MOE_E6, cluster("A100-SXM-80GB", 2, gpus_per_node=4), 8),
    (GQA.replace(n_layers=5, name="gqa-5-layers"), cluster("A100-SXM-80GB", 1, gpus_per_node=4), 4),
    # experts 98 wide (tp = 4 does not divide them, tp = 2 does) beside a dense width of 256
    (MODELS["tiny-moe"].replace(moe_ffn_hidden=98, name="moe-expert-width"),
     cluster("A100-SXM-80GB", 1, gpus_per_node=4), 8),
], ids=["dense", "moe", "gqa-two-nodes", "moe-e6-two-nodes", "uneven-stages", "moe-expert-width"])
def test_it_enumerates_exactly_the_plans_the_spec_accepts(model, clu, global_batch):
    rejected = {}
    enumerated = list(enumerate_plans(model, clu, global_batch, SPACE, rejected))
    assert len(enumerated) == len(set(enumerated))  # each plan once
    assert set(enumerated) == _spec_valid(model, clu, global_batch)
    assert rejected  # and it says what it cut


def test_it_lists_divisors():
    assert divisors(12) == (1, 2, 3, 4, 6, 12) and divisors(1) == (1,)
