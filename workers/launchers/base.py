from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class LaunchError(RuntimeError):
    """The job could not be started or controlled; the message says why and what to change."""


@dataclass(frozen=True)
class JobState:
    alive: bool
    exit_code: int | None = None  # known once the job has ended and its supervisor recorded it


class Launcher(Protocol):
    def start(self, run_dir: Path, nproc: int, resume: bool, env_setup: str = "") -> str:
        """Start the trainer for the spec.json in ``run_dir``; return a job id."""

    def poll(self, run_dir: Path, job_id: str) -> JobState: ...

    def stop(self, run_dir: Path, job_id: str) -> None:
        """Ask the job to stop (SIGTERM: the trainer saves a checkpoint and exits)."""
