"""Every step record of a multi-rank job carries each rank's step time, throughput and peak memory (one small
all-gather a step); a world of one writes none, its figures being the record's own."""
import pytest

from tests.trainer.launch import records
from trainer.contract.records import RANK_FIGURES, is_step_row

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["moe-native-ep2", "ds-zero1", "ds-pp2-zero1"])
def test_each_step_records_every_ranks_figures(engine_runs, name):
    steps = [r for r in records(engine_runs / name) if is_step_row(r)]
    assert steps
    for row in steps:
        assert set(row["ranks"]) == set(RANK_FIGURES)
        assert all(len(values) == 2 for values in row["ranks"].values())
        assert row["ranks"]["step_time_s"][0] == pytest.approx(row["step_time_s"])  # rank 0 wrote the row
        assert all(t > 0 for t in row["ranks"]["step_time_s"]) and all(s > 0 for s in row["ranks"]["tokens_per_s"])
        assert all(b is None or isinstance(b, int) for b in row["ranks"]["max_allocated_bytes"])  # None: a CPU
        assert row["time"] > 1.6e9


def test_a_world_of_one_records_no_ranks(engine_runs):
    steps = [r for r in records(engine_runs / "ref") if is_step_row(r)]
    assert steps and not any("ranks" in r for r in steps) and all(r["time"] > 1.6e9 for r in steps)
