from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence


class LaunchError(RuntimeError):
    """The job could not be started or controlled; the message says why and what to change."""


@dataclass(frozen=True)
class JobState:
    alive: bool
    exit_code: int | None = None  # known once the job has ended and its supervisor recorded it


@dataclass(frozen=True)
class StartedJob:
    job_id: str
    command: list[str]  # what the job runs, exactly as started: launch.json records this list


class Launcher(Protocol):
    # The longest a start may take before it gives up; a launch claimed longer ago than this (and a margin)
    # belongs to a worker that died while starting.
    start_timeout_s: float

    def start(self, run_dir: Path, nproc: int, resume: bool, env_setup: Sequence[str] = ()) -> StartedJob:
        """Start the trainer for the spec.json in ``run_dir``; ``env_setup`` are the cluster's shell lines that run
        first (staff's, trusted, written verbatim)."""

    def poll(self, run_dir: Path, job_id: str) -> JobState: ...

    def stop(self, run_dir: Path, job_id: str) -> None:
        """Ask the job to stop (SIGTERM: the trainer saves a checkpoint and exits)."""
