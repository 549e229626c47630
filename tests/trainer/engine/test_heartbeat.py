"""Each rank's heartbeat: what it is doing, rewritten by a thread of its own while the loop waits."""
import time

import pytest

from tests.trainer.conftest import RESUME_STEPS
from trainer.contract.records import Heartbeat, Phase
from trainer.engine.heartbeat import HeartbeatThread


def test_it_beats_on_while_the_rank_waits_and_keeps_when_the_step_began(tmp_path):
    heartbeat = HeartbeatThread(tmp_path, rank=1, world_size=2, every_s=0.05).start()
    heartbeat.step_done(3, 0.2)
    heartbeat.enter(Phase.STEP, 3)
    began = time.time()
    time.sleep(0.4)  # waiting, as in a collective: the interpreter is free for the thread
    (beat,) = Heartbeat.read_all(tmp_path)
    assert (beat.rank, beat.world_size, beat.step, beat.phase, beat.median_step_s) == (1, 2, 3, Phase.STEP, 0.2)
    assert beat.phase_since <= began + 0.01 and beat.time > began + 0.2
    heartbeat.stop()
    (beat,) = Heartbeat.read_all(tmp_path)
    assert beat.phase == Phase.DONE and not heartbeat._thread.is_alive()


@pytest.mark.slow
def test_a_finished_run_leaves_each_rank_done_at_its_last_step(single_rank_runs):
    (beat,) = Heartbeat.read_all(single_rank_runs / "resume-straight")
    assert (beat.rank, beat.step, beat.phase) == (0, RESUME_STEPS, Phase.DONE)
    assert 0 < beat.median_step_s < 10 and beat.process_started <= beat.phase_since <= beat.time
