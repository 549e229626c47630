"""torch.profiler over the steps a ProfileSpec names, written per rank as a gzipped chrome trace and its digest.

    <run>/profiles/<name>/rank-<r>.trace.json.gz, summary-rank-<r>.json   (trainer.profiling.digest merges them)
                          timeline-rank-<r>.json                           (trainer.profiling.timeline: spans to draw)
"""
from __future__ import annotations

import gzip
import importlib
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from trainer.contract.runfolder import PROFILES, write_json_atomic
from trainer.profiling.digest import complete_events, summarize_trace
from trainer.profiling.timeline import write_timeline


def prepare() -> None:
    """Call before the job joins its process group when it is to profile; nothing else needs it, and it costs a
    rank about 1.5 s of imports.

    torch.profiler imports torch._inductor when a profile first starts, and that import reaches
    torch.distributed.nn.functional, whose functions take ``group=group.WORLD`` as a default, evaluated at import.
    Imported after the job joined its process group, those defaults hold the group for good: destroy_process_group no
    longer frees it, gloo's worker threads live on into the interpreter's shutdown, and one that drops a tensor there
    aborts the rank ("terminate called without an active exception"). Imported before any group exists, the defaults
    are None."""
    importlib.import_module("torch._inductor.config")


class StepProfiler:
    """torch.profiler over the steps a ProfileSpec names; a no-op without one.

    Call ``step()`` after every training step and ``close()`` at the end (or use it as a context manager).
    ``first_step`` is the step the loop starts from, so a resumed run profiles the same absolute steps; a run
    resumed past ``start_step`` does not profile.
    """

    def __init__(self, profile_spec, out_dir: str | os.PathLike, rank: int, first_step: int = 0):
        self.spec, self.rank = profile_spec, rank
        self.folder = Path(out_dir) / PROFILES / profile_spec.name if profile_spec else None
        self.trace_path = self.folder / f"rank-{rank}.trace.json.gz" if self.folder else None
        self.summary_path = self.folder / f"summary-rank-{rank}.json" if self.folder else None
        self.summary: dict[str, Any] | None = None
        self._prof = None
        self._calls = 0  # step() calls so far
        if profile_spec is None or first_step > profile_spec.start_step:
            return
        self._lead = profile_spec.start_step - first_step  # unrecorded steps before the first profiled one
        warmup = min(profile_spec.warmup, self._lead)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")  # warmup=0 is the spec's choice, not a mistake
            when = schedule(wait=self._lead - warmup, warmup=warmup, active=profile_spec.steps, repeat=1)
        self._prof = profile(activities=activities, schedule=when, on_trace_ready=self._write,
                             record_shapes=False, with_stack=False)
        self._prof.start()

    @property
    def enabled(self) -> bool:
        """True until the profile is written (or closed): the loop can stop calling step() once it turns False."""
        return self._prof is not None

    @property
    def written(self) -> bool:
        return self.summary is not None

    def step(self) -> None:
        if self._prof is not None:
            self._calls += 1
            self._prof.step()
            if self.summary is not None:  # the window is over and written: stop paying for step markers
                self.close()

    def close(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()  # inside the active window this still writes what was recorded

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _write(self, prof) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, raw = tempfile.mkstemp(prefix=f".rank-{self.rank}.", suffix=".json", dir=self.folder)
        os.close(fd)
        packed = raw + ".gz"
        try:
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(packed, 0o644)
            os.replace(packed, self.trace_path)
        finally:
            Path(raw).unlink(missing_ok=True)
            Path(packed).unlink(missing_ok=True)
        done = min(self.spec.steps, max(0, self._calls - self._lead))  # profiled steps that finished
        events = None
        try:
            events = complete_events(self.trace_path)  # read once for the digest and the timeline
            summary = {"rank": self.rank, "profile": self.spec.name,
                       **summarize_trace(self.trace_path, steps=done, events=events)}
        except Exception as exc:  # a digest that fails must not fail the training run; the trace is kept
            print(f"profiling: could not summarize {self.trace_path}: {exc!r}", file=sys.stderr)
            summary = {"rank": self.rank, "profile": self.spec.name, "trace": self.trace_path.name,
                       "error": repr(exc)}
        try:
            write_timeline(self.trace_path, self.rank, steps=done, events=events)
        except Exception as exc:  # neither may a timeline: the page then says how to write it again
            print(f"profiling: could not write the timeline of {self.trace_path}: {exc!r}", file=sys.stderr)
        write_json_atomic(self.summary_path, summary)
        self.summary = summary
