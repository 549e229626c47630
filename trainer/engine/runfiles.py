"""What the loop writes and listens to: the run's files, the stop request, and the merged profile report."""
from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.contract.records import ATTEMPT, SINCE, Event, EvalMetrics, StepMetrics, event
from trainer.contract.runfolder import ATTEMPT_ENV, EVENTS, LOGS, METRICS, append_jsonl, write_json_atomic
from trainer.profiling.digest import write_summary
from trainer.profiling.profiler import StepProfiler


class RunFiles:
    """Events and metrics (rank 0, or any rank for failures) and this rank's own log file. Each record is stamped
    with the attempt and the seconds since the rank's previous one (records.SINCE)."""

    def __init__(self, run_dir: Path, rank: int):
        self.run_dir, self.rank = Path(run_dir), rank
        self._attempt = _attempt_from_env()
        self._last_record = time.perf_counter()
        self.log_path = self.run_dir / LOGS / f"rank-{rank}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # When the launcher already sends stdout into our log file, printing too would write every line twice.
        try:
            self._echo = os.fstat(1).st_ino != os.stat(self.log_path).st_ino
        except OSError:
            self._echo = True

    def log(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} rank {self.rank}: {message}"
        with open(self.log_path, "a") as f:
            f.write(line + "\n")
        if self._echo and self.rank == 0:
            print(line, flush=True)

    def event(self, kind: str, any_rank: bool = False, **fields: Any) -> None:
        if self.rank == 0 or any_rank:
            append_jsonl(self.run_dir / EVENTS, self._stamped(event(kind, self.rank, **fields)))

    @contextlib.contextmanager
    def failure_recorded(self):
        """Any exception inside is logged and written as a "failed" event with its traceback, then re-raised."""
        try:
            yield
        except Exception as exc:
            self.log(f"failed: {exc!r}")
            # an error that another attempt would only repeat says so (retry False): the workbench does not restart;
            # one that ran out of memory too (out_of_memory): the workbench may re-plan
            self.event(Event.FAILED, any_rank=True, error=repr(exc), traceback=traceback.format_exc(),
                       **({} if getattr(exc, "retry", True) else {"retry": False}),
                       **({"out_of_memory": True} if _out_of_memory(exc) else {}))
            raise

    def metric(self, record: StepMetrics | EvalMetrics) -> None:
        if self.rank == 0:
            append_jsonl(self.run_dir / METRICS, self._stamped(record.to_dict()))

    def _stamped(self, record: dict[str, Any]) -> dict[str, Any]:
        now = time.perf_counter()
        since, self._last_record = now - self._last_record, now
        return {"time": time.time(), **record, SINCE: round(since, 6),
                **({ATTEMPT: self._attempt} if self._attempt else {})}


def _out_of_memory(exc: Exception) -> bool:
    """A GPU's allocator, or the host's, could not give the memory asked for."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(exc)


def _attempt_from_env() -> int | None:
    value = os.environ.get(ATTEMPT_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


class StopRequest:
    """SIGTERM (scheduler pre-emption, scancel, the web app's stop): finish the step, save, exit cleanly."""

    def __init__(self):
        self.requested = False
        self.previous = signal.signal(signal.SIGTERM, self._handle)

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self.previous)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank was asked to stop: all ranks must stop at the same step."""
        if dist.get_world_size() == 1:
            return self.requested
        flag = torch.tensor(float(self.requested), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


class ProfileReport:
    """The profiler's steps, and its report: once every rank has written its trace (the same step on all ranks),
    rank 0 merges the summaries and records a profile_written event."""

    def __init__(self, profiler: StepProfiler, files: RunFiles, world_size: int,
                 schedule: dict[str, Any] | None = None):
        self.profiler, self.files, self.world_size = profiler, files, world_size
        self.schedule = schedule  # the pipeline schedule's action order, kept beside the trace it explains
        self.done = False

    def after_step(self) -> None:
        self.profiler.step()
        if self.profiler.written:
            self._once()

    def close(self) -> None:
        """At the run's end: a window cut short by it still writes what it recorded."""
        self.profiler.close()
        if self.profiler.written:
            self._once()

    def _once(self) -> None:
        if self.done:
            return
        self.done = True
        if self.schedule is not None:
            write_json_atomic(self.profiler.folder / f"schedule-rank-{self.files.rank}.json", self.schedule)
        if self.world_size > 1:
            dist.barrier()
        if self.files.rank == 0:
            folder = self.profiler.folder
            summary = write_summary(folder)
            scalars = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))} \
                if isinstance(summary, dict) else None
            self.files.event(Event.PROFILE_WRITTEN, name=self.profiler.spec.name,
                             path=str(folder.relative_to(self.files.run_dir)), summary=scalars)
