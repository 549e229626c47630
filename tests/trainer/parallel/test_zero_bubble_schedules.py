"""The planner's bubble and activation counts for the zero-bubble schedules are those of the orders torch runs.

torch builds every rank's order of actions when a schedule is constructed; stand-in stages (shapes of a pipeline,
no process group) are enough for that. The orders are laid out with free communication and forward, input-backward
and weight-backward alike (trainer.planner.schedule), which is what the planner's closed forms assume.
"""
import types

import pytest
import torch

from trainer.contract import ParallelPlan
from trainer.parallel.pipeline import SINGLE_STAGE, schedule_class, schedule_record, stage_ids
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.planner.estimate import memory as M
from trainer.planner.estimate.core import Planner
from trainer.planner.schedule import orders_from_json, simulate

CASES = [("zb-interleaved", 1), ("zb-interleaved", 2), ("zbv", 2), ("dualpipev", 2)]


def _torch_order(kind: str, pp: int, microbatches: int, v: int) -> dict:
    """The order torch's schedule gives every pipeline rank, built on rank 0's stand-in stages."""
    n_stages = pp * v
    stages = [types.SimpleNamespace(group_size=pp, group_rank=0, num_stages=n_stages, stage_index=i,
                                    is_first=i == 0, is_last=i == n_stages - 1, has_backward=True,
                                    submod=torch.nn.Linear(1, 1), stage_index_to_group_rank={}, scale_grads=True)
              for i in stage_ids(0, pp, v, kind)]
    schedule = schedule_class(kind)(stages[0] if kind in SINGLE_STAGE else stages, n_microbatches=microbatches)
    return schedule_record(schedule, kind, pp, 0, v, microbatches)


def _peak_in_flight(actions, chunks: int) -> float:
    """Most micro-batches whose activations a rank holds at once: forwards run minus weight (or full) backwards
    run, in chunks, as a share of the rank's layers."""
    held = peak = 0
    for kind, _, _ in actions:
        held += 1 if kind == "F" else -1 if kind in "BW" else 0
        peak = max(peak, held)
    return peak / chunks


@pytest.mark.parametrize("kind,v", CASES, ids=[f"{k}-v{v}" for k, v in CASES])
@pytest.mark.parametrize("pp,m", [(2, 4), (2, 8), (4, 8), (4, 16)])
def test_the_planner_models_the_bubble_and_activations_of_torchs_own_order(kind, v, pp, m):
    record = _torch_order(kind, pp, m, v)
    orders = orders_from_json(record["order"])
    assert sorted(orders) == list(range(pp))
    plan = ParallelPlan(pp=pp, global_batch=m, pipeline_schedule=kind, virtual_stages=v).validate()
    # every rank idles the same share, the planner's bubble over the step it stretches
    bubble = M.bubble_fraction(plan)
    for timeline in simulate(orders).ranks:
        assert timeline.idle_share == pytest.approx(bubble / (1 + bubble), abs=1e-9)
        assert _peak_in_flight(orders[timeline.rank], v) == M.in_flight(plan, timeline.rank)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 16)])
def test_zero_bubble_idles_a_third_of_1f1b_per_chunk(pp, m):
    one_f_one_b = M.bubble_fraction(ParallelPlan(pp=pp, global_batch=m))
    assert M.bubble_fraction(ParallelPlan(pp=pp, global_batch=m, pipeline_schedule="zb-interleaved")) \
        == pytest.approx(one_f_one_b / 3)
    assert M.bubble_fraction(ParallelPlan(pp=pp, global_batch=m, pipeline_schedule="zbv", virtual_stages=2)) \
        == pytest.approx(one_f_one_b / 6)


def test_a_v_places_both_ends_of_the_model_on_the_first_rank():
    assert [stage_ids(r, 4, 2, "zbv") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [stage_ids(r, 4, 2, "interleaved") for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    plan = ParallelPlan(pp=4, global_batch=8, pipeline_schedule="dualpipev", virtual_stages=2)
    assert M.holds_last_stage(plan, 0) and not M.holds_last_stage(plan, 3)
    # so the planner puts the head's parameters, the logits and the loss on rank 0, where the trainer has them
    planner = Planner(MODELS["tiny"], local_cpu_cluster(4))
    looped, v_shaped = (planner.evaluate(p).stages for p in (plan.replace(pipeline_schedule="zb-interleaved"), plan))
    head = looped[1].params - v_shaped[1].params
    assert head > 0 and v_shaped[0].params == looped[0].params + head
    assert "logits_and_grad" in v_shaped[0].buffers and "logits_and_grad" not in v_shaped[1].buffers


def test_the_recorded_order_of_a_single_stage_schedule_is_the_one_its_loop_runs():
    """GPipe's and 1F1B's own loops, not their ``pipeline_order``, decide what runs: the record lays out cleanly."""
    for kind in ("gpipe", "1f1b"):
        record = _torch_order(kind, 2, 4, 1)
        timelines = simulate(orders_from_json(record["order"])).ranks
        assert [t.idle_share for t in timelines] == pytest.approx([1 / 5, 1 / 5])
