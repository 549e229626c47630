"""The benchmark's measurements work (its timings are printed by python -m bench.trainer, not asserted)."""
from bench.trainer.activations import saved_activations


def test_it_measures_saved_activations_per_checkpointing_mode():
    rows = saved_activations(micro_batch=1)
    none, selective, full = (r["bytes"] for r in rows[:3])
    assert full * 3 < none and selective <= none
    gqa = saved_activations(micro_batch=1, positions="rope", n_kv_heads=1)
    assert gqa[1]["bytes"] < gqa[0]["bytes"]
