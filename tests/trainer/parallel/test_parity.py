"""Every parallel plan trains the same model as one process: per-step losses equal within 1e-5 relative.

Same seed → same initial weights before sharding; the data sampler gives the same global batch for any dp;
gradients are averaged, not summed, over micro-batches and replicas. What remains is floating-point order.
"""
import pytest

from tests.trainer.conftest import FOUR_RANK_PLANS, PARITY_STEPS, TWO_RANK_PLANS
from tests.trainer.launch import losses, max_rel_error, parity_stop, records

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5


def _reference(runs, kw):
    return runs / ("ref-tied" if kw.get("tied", True) else "ref-untied")


@pytest.mark.parametrize("name", list(TWO_RANK_PLANS))
def test_it_matches_one_process_on_two_ranks(two_rank_runs, single_rank_runs, name):
    _compare(single_rank_runs, two_rank_runs, name, TWO_RANK_PLANS[name])


@pytest.mark.parametrize("name", list(FOUR_RANK_PLANS))
def test_it_matches_one_process_on_four_ranks(four_rank_runs, single_rank_runs, name):
    _compare(single_rank_runs, four_rank_runs, name, FOUR_RANK_PLANS[name])


def _compare(references, runs, name: str, plan: dict) -> None:
    """Every step the plan ran (all PARITY_STEPS, or its first ones where it stops early) against the reference's."""
    got = losses(runs / name)
    assert len(got) == (parity_stop(plan) or PARITY_STEPS)
    assert max_rel_error(losses(_reference(references, plan))[:len(got)], got) < TOLERANCE


def test_it_learns(single_rank_runs):
    curve = losses(single_rank_runs / "ref-tied")
    assert curve[-1] < curve[0] - 0.5


def test_it_shards_model_state_with_fsdp(two_rank_runs, single_rank_runs):
    full = records(single_rank_runs / "ref-tied")[0]["memory"]
    sharded = records(two_rank_runs / "dp2-fsdp")[0]["memory"]
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert sharded[key] <= full[key] / 2 + 4096, key  # half each, up to padding of odd-sized tensors
    assert len(sharded["per_rank"]) == 2
