"""The run folder's file discipline (see docs/architecture.md): whole lines appended, whole files renamed into place.

Standard library only, so that workers can read run folders without importing torch.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

SPEC = "spec.json"
LAUNCH = "launch.json"
EVENTS = "events.jsonl"
JOBS = "jobs.jsonl"  # written by the job around the trainer (batch script, supervisor), not by the trainer
METRICS = "metrics.jsonl"
LOGS = "logs"
PROFILES = "profiles"
CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
HEARTBEATS = "heartbeats"
SKIPPED_BATCHES = "skipped_batches.json"  # the batches a run skipped after loss spikes (records.Skip)
# The environment variable that tells a job's processes which attempt of their run they are (a positive integer)
ATTEMPT_ENV = "WORKBENCH_ATTEMPT"


def write_json_atomic(path: str | os.PathLike, data: Any, durable: bool = True) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it into place: readers never see half a file.
    ``durable``: flushed to the disk before the rename (a file rewritten every few seconds need not be)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; run folders are read by workers and other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_jsonl(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as one line with a single write, so concurrent readers see whole lines or nothing."""
    line = json.dumps(record, separators=(",", ":")) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike, start: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (offset after the line, record) from byte ``start``; stop quietly at a torn or unparsable last line.

    The offset lets an ingester resume where it stopped without re-reading the file.
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        f.seek(start)
        offset = start
        for raw in f:
            if not raw.endswith(b"\n"):
                return  # a writer is mid-line; take it next time
            offset += len(raw)
            try:
                record = json.loads(raw)
            except ValueError:
                continue  # a damaged line is skipped, never fatal
            if isinstance(record, dict):
                yield offset, record


def read_json(path: str | os.PathLike) -> Any | None:
    """A whole JSON file, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


# What a run writes (spec.json and launch.json come from the launcher and stay).
RUN_OUTPUTS = (EVENTS, METRICS, CHECKPOINTS, PROFILES, HEARTBEATS, SKIPPED_BATCHES)


def used(run_dir: str | os.PathLike) -> bool:
    """Whether a run has already written into ``run_dir``: training into it again must resume or start over."""
    return any((Path(run_dir) / name).exists() for name in RUN_OUTPUTS)


def clear_outputs(run_dir: str | os.PathLike) -> None:
    """Start over: remove what earlier runs wrote (logs stay, and go on being appended to)."""
    for name in RUN_OUTPUTS:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
