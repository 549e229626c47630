import pytest

from trainer.planner.schedule import (Deadlock, ScheduleError, orders_from_json, schedule_orders, simulate)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 2), (2, 5), (3, 6), (4, 4), (4, 9)])
def test_gpipe_and_1f1b_idle_as_the_closed_form_on_every_rank(schedule, p, m):
    sim = simulate(schedule_orders(schedule, p, m))
    assert [r.rank for r in sim.ranks] == list(range(p))
    for rank in sim.ranks:
        assert rank.idle_share == pytest.approx((p - 1) / (m + p - 1))
        assert rank.busy == 3 * m  # F = 1 and B = 2 units per micro-batch
    assert sim.makespan == 3 * (m + p - 1)


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (2, 3, 6), (3, 2, 6), (4, 2, 8), (4, 3, 12)])
def test_interleaving_v_stages_per_rank_cuts_the_idle_share_to_the_closed_form(p, v, m):
    orders = schedule_orders("interleaved", p, m, virtual_stages=v)
    for rank, order in orders.items():  # looped placement: rank r holds stages r, r+p, …
        assert {stage for _, stage, _ in order} == {rank + k * p for k in range(v)}
    for rank in simulate(orders).ranks:
        assert rank.idle_share == pytest.approx((p - 1) / (v * m + p - 1))


def test_each_action_starts_after_its_dependencies_and_its_ranks_previous_action():
    sim = simulate(schedule_orders("interleaved", 2, 4, virtual_stages=2))
    ends = {s.action: s.end for r in sim.ranks for s in r.spans}
    last = max(stage for (_, stage, _) in ends)
    for rank in sim.ranks:
        for before, span in zip(rank.spans, rank.spans[1:]):
            assert span.start >= before.end
        for span in rank.spans:
            kind, stage, mb = span.action
            if kind == "F" and stage > 0:
                assert span.start >= ends[("F", stage - 1, mb)]
            if kind == "B":
                assert span.start >= ends[("F", stage, mb)]
                if stage < last:
                    assert span.start >= ends[("B", stage + 1, mb)]


def test_a_two_stage_gpipe_step_is_laid_out_as_drawn_by_hand():
    sim = simulate(schedule_orders("gpipe", 2, 2))
    as_drawn = {r.rank: [(s.start, s.end, f"{s.kind}{s.microbatch}") for s in r.spans] for r in sim.ranks}
    assert as_drawn == {0: [(0, 1, "F0"), (1, 2, "F1"), (5, 7, "B0"), (7, 9, "B1")],
                        1: [(1, 2, "F0"), (2, 3, "F1"), (3, 5, "B0"), (5, 7, "B1")]}


def test_splitting_backward_into_inputs_and_weights_lets_weights_fill_the_bubble():
    # Two stages, two micro-batches: the last stage's I hands the gradient back at once; stage 0's weight work and
    # stage 1's own W run while the other waits.
    orders = {0: [("F", 0, 0), ("F", 0, 1), ("I", 0, 0), ("I", 0, 1), ("W", 0, 0), ("W", 0, 1)],
              1: [("F", 1, 0), ("I", 1, 0), ("F", 1, 1), ("I", 1, 1), ("W", 1, 0), ("W", 1, 1)]}
    split = simulate(orders)
    whole = simulate(schedule_orders("1f1b", 2, 2))
    assert split.makespan < whole.makespan
    w = next(s for s in split.rank(0).spans if s.action == ("W", 0, 0))
    i = next(s for s in split.rank(0).spans if s.action == ("I", 0, 0))
    assert w.start >= i.end
    heavy = simulate(orders, costs={"W": 3})
    assert heavy.rank(0).busy == 2 * 1 + 2 * 1 + 2 * 3


def test_an_order_that_waits_on_itself_is_a_deadlock_that_names_the_wait():
    with pytest.raises(Deadlock, match=r"rank 1's next action 1B0 waits for 1F0, which rank 1 runs only after 1B0"):
        simulate({0: [("F", 0, 0), ("B", 0, 0)], 1: [("B", 1, 0), ("F", 1, 0)]})
    with pytest.raises(Deadlock, match=r"0W0 waits for 0I0, which no rank runs"):
        simulate({0: [("F", 0, 0), ("B", 0, 0), ("W", 0, 0)]})


def test_malformed_orders_are_refused_with_what_is_wrong():
    with pytest.raises(ScheduleError, match="listed twice"):
        simulate({0: [("F", 0, 0)], 1: [("F", 0, 0)]})
    with pytest.raises(ScheduleError, match="not a compute action"):
        simulate({0: [("SEND_F", 0, 0)]})
    with pytest.raises(ScheduleError, match="both a full backward"):
        simulate({0: [("F", 0, 0), ("B", 0, 0), ("I", 0, 0)]})
    with pytest.raises(ScheduleError, match="not generated here"):
        schedule_orders("zbv", 2, 4)


def test_a_recorded_order_reads_back_as_the_simulators_input():
    recorded = {"0": [["F", 0, 0], ["F", 0, 1], ["B", 0, 0], ["B", 0, 1]],
                "1": [["F", 1, 0], ["B", 1, 0], ["F", 1, 1], ["B", 1, 1]]}
    assert orders_from_json(recorded) == schedule_orders("1f1b", 2, 2)
    for bad in ({}, {"zero": []}, {"0": [["F", 0]]}, {"0": [["F", -1, 0]]}):
        with pytest.raises(ScheduleError):
            orders_from_json(bad)
