"""Section 1 of the benchmark runs (its ratio is printed by python -m bench.trainer, not asserted: the machine that
runs the tests is shared)."""
import torch.distributed as dist

from bench.trainer.overhead import engine_vs_plain


def test_it_times_the_engine_and_its_loop_against_a_plain_loop_in_alternating_pairs(dataset, tmp_path):
    joined_here = not dist.is_initialized()
    try:
        o = engine_vs_plain(tmp_path, dataset, steps=4, pairs=2)
    finally:
        if joined_here and dist.is_initialized():
            dist.destroy_process_group()
    assert o["pairs"] == 2 and min(o["plain_ms"], o["engine_ms"], o["loop_ms"]) > 0
    for ratio, (low, high) in ((o["ratio"], o["ratio_range"]), (o["loop_ratio"], o["loop_ratio_range"])):
        assert 0 < low <= ratio <= high
