"""Recompute trades compute for memory without changing the maths."""
import pytest

from tests.trainer.launch import losses, max_rel_error, records

pytestmark = pytest.mark.slow


def _saved(runs, mode):
    return records(runs / f"ac-{mode}")[0]["memory"]["activations_bytes"]


def test_it_keeps_the_losses(single_rank_runs):
    ref = losses(single_rank_runs / "ac-none")
    for mode in ("selective", "full"):
        assert max_rel_error(ref, losses(single_rank_runs / f"ac-{mode}")) < 1e-6


def test_it_saves_fewer_activation_bytes(single_rank_runs):
    none, selective, full = (_saved(single_rank_runs, m) for m in ("none", "selective", "full"))
    assert full * 3 <= none
    assert selective < none
