"""A run's log files, read a bounded chunk at a time from a byte offset, so a browser can follow a log as it grows.

Only the files the trainer and the launchers write are served: ``logs/rank-<n>.log`` (each rank),
``logs/launcher.log`` (a local launch's supervisor) and ``logs/slurm-<job>.out`` (a Slurm job's output). A name is
checked against those shapes before it touches the disk, and the file it names must resolve inside the run folder,
so neither a crafted name nor a link planted in ``logs/`` reaches any other file.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.contract.runfolder import LOGS

from ..models import Run

LOG_NAME = re.compile(r"rank-(\d{1,7})\.log|launcher\.log|slurm-[A-Za-z0-9_.-]{1,64}\.out")
MAX_CHUNK_BYTES = 1024 * 1024
MAX_LISTED = 1000  # a logs folder holds a file a rank; the listing stops here


class NoSuchLog(LookupError):
    pass


@dataclass(frozen=True)
class LogChunk:
    file: str
    offset: int        # where the text starts (the offset asked, or the size when that lies past the end)
    next_offset: int   # where the next read starts
    size: int          # the file's size when it was read
    more: bool         # bytes follow next_offset already
    text: str          # UTF-8, undecodable bytes as U+FFFD

    def to_dict(self) -> dict:
        return asdict(self)


def log_files(run: Run) -> list[dict]:
    """The run's log files with their sizes: the launcher's and Slurm's first, then the ranks in order."""
    folder = _folder(run)
    if folder is None or not folder.is_dir():
        return []
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if len(found) >= MAX_LISTED:
                break
            match = LOG_NAME.fullmatch(entry.name)
            if match and _inside(run, Path(entry.path)) and entry.is_file():
                rank = int(match.group(1)) if match.group(1) else -1
                found.append((rank, entry.name, entry.stat().st_size))
    return [{"name": name, "size": size} for _, name, size in sorted(found)]


def log_read(run: Run, name: str, offset: int, limit: int) -> LogChunk:
    """At most ``limit`` bytes of log ``name`` from byte ``offset``; a chunk that would end inside a UTF-8
    character ends before it instead, so that chunks joined give the text the file holds."""
    path = _path(run, name)
    limit = max(1, min(limit, MAX_CHUNK_BYTES))
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = min(offset, size)
            f.seek(start)
            data = f.read(limit)
    except OSError as exc:  # removed since it was listed (a restart clears the folder), or unreadable
        raise NoSuchLog(f"run {run.pk}'s log file {name!r} cannot be read: {exc.strerror}") from None
    more = start + len(data) < size
    if more:
        data = _whole_characters(data)
    return LogChunk(file=name, offset=start, next_offset=start + len(data), size=size, more=more,
                    text=data.decode("utf-8", errors="replace"))


def _folder(run: Run) -> Path | None:
    return Path(run.run_dir) / LOGS if run.run_dir else None


def _inside(run: Run, path: Path) -> bool:
    return path.resolve().is_relative_to(Path(run.run_dir).resolve())


def _path(run: Run, name: str) -> Path:
    folder = _folder(run)
    if folder is None or not LOG_NAME.fullmatch(name):
        raise NoSuchLog(f"run {run.pk} has no log file {name!r}")
    path = folder / name
    if not path.is_file() or not _inside(run, path):
        raise NoSuchLog(f"run {run.pk} has no log file {name!r}")
    return path.resolve()


def _whole_characters(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut off at its end (left whole when that would leave nothing)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for the character's first byte
            continue
        length = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return data[:-back] if length > back and len(data) > back else data
    return data
