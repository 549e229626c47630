"""Telling a hung collective from a slow step by the ranks' heartbeats (workers.hangs)."""
from dataclasses import replace

from trainer.contract.records import Heartbeat, Phase
from workers.hangs import find_hang

NOW, SUBMITTED = 10_000.0, 9_000.0


def beat(rank: int, step: int = 7, phase: str = Phase.STEP, since: float = NOW - 60, median: float | None = 1.0,
         last: float = NOW, world: int = 2) -> Heartbeat:
    return Heartbeat(rank=rank, world_size=world, host=f"n{rank + 1}", pid=100 + rank, process_started=SUBMITTED + 5,
                     step=step, phase=phase, phase_since=since, median_step_s=median, every_s=1.0, time=last)


def hang(beats, multiple=10, least_s=30):
    return find_hang(beats, NOW, SUBMITTED, multiple, least_s)


def test_a_frozen_rank_is_named_as_the_one_the_others_wait_for():
    found = hang([beat(0), beat(1, since=NOW - 65, last=NOW - 50)])
    assert found.stuck == ((1, "n2"),) and "frozen" in found.why
    assert (found.step, round(found.silent_s), found.limit_s) == (7, 60, 30)
    assert "rank 1 on n2" in found.message and "step 8" in found.message


def test_a_rank_behind_the_others_is_named_when_every_rank_still_beats():
    found = hang([beat(0, step=8), beat(1, step=7), beat(2, step=8)])
    assert found.stuck == ((1, "n2"),) and found.why == "behind the others"


def test_every_rank_is_named_when_all_wait_in_the_same_step():
    assert hang([beat(0), beat(1)]).stuck == ((0, "n1"), (1, "n2"))


def test_no_hang_before_the_limit_of_so_many_median_steps():
    assert hang([beat(0, since=NOW - 15), beat(1, last=NOW - 50)], least_s=20) is None  # 15 s of 20
    slow = [beat(0, since=NOW - 25, median=3.0), beat(1, since=NOW - 40, last=NOW - 50, median=3.0)]
    assert hang(slow, least_s=20) is None  # 10 × 3 s = 30 s not yet reached
    assert hang(slow, least_s=20, multiple=5).limit_s == 20


def test_a_live_rank_that_saves_or_evaluates_is_not_a_hang():
    for phase in (Phase.SAVING, Phase.EVALUATING, Phase.STARTING, Phase.DONE):
        assert hang([beat(0, phase=phase), beat(1, since=NOW - 90, last=NOW - 80)]) is None, phase
    # but a frozen rank counts as stuck whatever it was doing
    assert hang([beat(0), beat(1, phase=Phase.SAVING, since=NOW - 90, last=NOW - 80)]).stuck == ((1, "n2"),)


def test_beats_of_an_earlier_attempt_or_of_too_few_ranks_are_not_judged():
    old = replace(beat(1, since=NOW - 900, last=NOW - 800), process_started=SUBMITTED - 1000)
    assert hang([beat(0), old]) is None
    assert hang([beat(0)]) is None  # rank 1 has not written yet: its rendezvous may take its time


def test_the_first_step_of_an_attempt_is_not_judged_however_long_it_takes():
    assert hang([beat(0, step=0, median=None, since=NOW - 3600), beat(1, step=0, median=None)]) is None
    assert hang([beat(0, step=1, median=2.0, since=NOW - 3600), beat(1, step=0, median=None)]) is not None
