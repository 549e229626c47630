"""Stragglers (trainer/engine/stragglers.py): each rank's own work timed up to its last gradient, and a rank named
when its median over a window is a set factor above the other ranks'."""
import torch

from trainer.contract import ParallelPlan
from trainer.engine.stragglers import ComputeClock, StragglerWatch

HOSTS = ["n1", "n2", "n3"]


def test_a_rank_slower_than_the_others_by_the_factor_over_the_window_is_named_once_until_it_catches_up():
    watch = StragglerWatch(factor=1.5, window=4, hosts=HOSTS)
    steps = [[1.0, 1.0, 1.0]] * 3 + [[1.0, 9.0, 1.0]]  # one slow step: the median does not move
    assert [watch.observe(step) for step in steps] == [[]] * 4
    (found,) = [s for step in [[1.0, 2.0, 1.0]] * 2 for s in watch.observe(step)]  # rank 1's median: 1.5, then 2
    assert (found.rank, found.host, found.ratio) == (1, "n2", 2.0)
    assert "rank 1 on n2 is a straggler" in found.describe(4) and "2.00×" in found.describe(4)
    assert watch.observe([1.0, 2.0, 1.0]) == []  # named already
    for _ in range(4):
        watch.observe([1.0, 1.0, 1.0])  # caught up …
    assert [s.rank for step in [[1.0, 3.0, 1.0]] * 4 for s in watch.observe(step)] == [1]  # … and fell behind again


def test_nothing_is_judged_in_a_world_of_one_where_a_rank_is_not_measured_or_when_turned_off():
    assert StragglerWatch(1.5, 2, ["n1"]).observe([5.0]) == []
    unmeasured = StragglerWatch(1.5, 2, HOSTS[:2])
    assert [unmeasured.observe([1.0, None]) for _ in range(3)] == [[]] * 3
    off = StragglerWatch(0.0, 2, HOSTS[:2])
    assert [off.observe([1.0, 9.0]) for _ in range(3)] == [[]] * 3


def test_the_clock_stops_at_the_first_parameters_gradient_and_only_where_no_backward_waits_on_other_ranks():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    clock = ComputeClock.for_plan(ParallelPlan(dp=2, micro_batch=1, global_batch=2), model, fsdp=False)
    assert clock.read() is None  # no step yet
    clock.start()
    model(torch.ones(2, 4)).sum().backward()
    seconds = clock.read()
    assert seconds is not None and 0 < seconds < 5
    for plan, fsdp in ((ParallelPlan(tp=2, micro_batch=1, global_batch=1), False),
                       (ParallelPlan(pp=2, micro_batch=1, global_batch=2), False),
                       (ParallelPlan(dp=2, micro_batch=1, global_batch=2, zero_stage=3), True)):
        unmeasured = ComputeClock.for_plan(plan, model, fsdp)
        unmeasured.start()
        model(torch.ones(2, 4)).sum().backward()
        assert unmeasured.read() is None
