"""A rank's heartbeat: a thread of its own rewrites heartbeats/rank-<r>.json every few seconds (records.Heartbeat).

A thread, not the training loop, so that the beat goes on while the rank waits in a collective (the collectives
release the interpreter while they wait) and stops only when the process is frozen, killed or its node lost. The
loop tells it what it is doing: starting, a step (and how long steps take), evaluating, saving.
"""
from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections import deque
from pathlib import Path

from trainer.contract.records import Heartbeat, Phase

EVERY_ENV = "WORKBENCH_HEARTBEAT_S"   # seconds between beats, for a site or a test that wants another cadence
DEFAULT_EVERY_S = 5.0
RECENT_STEPS = 20                     # the steps whose median the beat carries


class HeartbeatThread:
    def __init__(self, run_dir: Path, rank: int, world_size: int, every_s: float | None = None):
        self.run_dir, self.rank, self.world_size = Path(run_dir), rank, world_size
        self.every_s = every_s or float(os.environ.get(EVERY_ENV) or DEFAULT_EVERY_S)
        # Slurm names the node as the scheduler knows it; elsewhere the host's name
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.started = time.time()
        self._lock = threading.Lock()
        self._step, self._phase, self._since = 0, Phase.STARTING, self.started
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-rank-{rank}", daemon=True)

    def start(self) -> "HeartbeatThread":
        self._beat()
        self._thread.start()
        return self

    def enter(self, phase: str, step: int | None = None) -> None:
        """The rank begins ``phase`` (a step: the step after ``step`` done)."""
        with self._lock:
            self._phase, self._since = phase, time.time()
            if step is not None:
                self._step = step

    def step_done(self, step: int, seconds: float) -> None:
        with self._lock:
            self._step = step
            self._recent.append(seconds)

    def stop(self) -> None:
        """The last beat says the rank is done, whatever way it ended."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()
        self.enter(Phase.DONE)
        self._beat()

    def _beat(self) -> None:
        with self._lock:
            beat = Heartbeat(rank=self.rank, world_size=self.world_size, host=self.host, pid=os.getpid(),
                             process_started=self.started, step=self._step, phase=self._phase,
                             phase_since=self._since,
                             median_step_s=statistics.median(self._recent) if self._recent else None,
                             every_s=self.every_s)
        try:
            beat.write(self.run_dir)
        except OSError:  # a full or unreachable disk: training goes on, the watcher sees the beat grow old
            pass

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s):
            self._beat()
