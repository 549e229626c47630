"""The one interface every launcher implements: submit, find, poll many jobs at once, cancel, where the logs are.

A launcher knows nothing of the database: it is given a ``JobRequest`` (the run, the attempt, its folder, its spec
and the cluster's scheduler settings) and answers with job ids and ``JobState``s. The workers decide what a state
means for the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from trainer.contract import RunSpec


class LaunchError(RuntimeError):
    """The job could not be started or controlled; the message says why and what to change."""


@dataclass(frozen=True)
class SchedulerSettings:
    """A cluster's fields that reach the scheduler (webapp.models.Cluster without Django): checked when the cluster
    was saved, and checked again by whatever writes them into a script."""

    kind: str = "local"
    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: str = ""
    stop_before_limit_s: int = 120
    env_setup: tuple[str, ...] = ()
    container_image: str = ""
    rest_url: str = ""


@dataclass(frozen=True)
class JobRequest:
    run_id: int
    attempt: int
    run_dir: Path
    spec: RunSpec
    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    resume: bool = False
    exclude: tuple[str, ...] = ()  # nodes an earlier attempt's job failed on: the scheduler is asked to avoid them

    @property
    def job_name(self) -> str:
        """Names the run and the attempt, so that a launch repeated after a crash finds the job it submitted."""
        return job_name(self.run_id, self.attempt)


@dataclass(frozen=True)
class CommandRequest:
    """One command run once as a batch job of its own, on one node (a dataset's preparation): no ranks, no attempts.

    The launchers read ``job_name``, ``run_dir`` and ``settings`` of it as of a run's ``JobRequest``: the same
    look-up by name after a crash, the same script and output files in the folder."""

    job_name: str
    run_dir: Path             # the job's folder: its script, Slurm's output (the command's stderr), REPORT
    command: tuple[str, ...]
    settings: SchedulerSettings
    cpus: int = 1
    mounts: tuple[str, ...] = ()  # folders a container must see besides the code and run_dir (the command's data)


def job_name(run_id: int, attempt: int) -> str:
    return f"wb-run{run_id}-a{attempt}"


@dataclass(frozen=True)
class Job:
    """A job a launcher started, as the run records it."""

    job_id: str
    run_dir: Path


@dataclass(frozen=True)
class StartedJob:
    job_id: str
    command: list[str]  # what the job runs, exactly as started: launch.json records this list
    script: str = ""     # the batch script, for schedulers that take one


class JobStates:
    """The scheduler's words for a job's state. Pending and running ones may change; the rest are final."""

    PENDING, RUNNING, COMPLETING = "PENDING", "RUNNING", "COMPLETING"
    COMPLETED, FAILED, CANCELLED = "COMPLETED", "FAILED", "CANCELLED"
    TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED = "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"
    BOOT_FAIL, DEADLINE = "BOOT_FAIL", "DEADLINE"
    GONE = "GONE"  # the scheduler no longer knows the job and left no record of how it ended
    ACTIVE = frozenset({PENDING, RUNNING, COMPLETING, "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED",
                        "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                        "SPECIAL_EXIT", "UPDATE_DB"})


@dataclass(frozen=True)
class JobState:
    state: str
    exit_code: int | None = None  # known once the job has ended, where the scheduler or the job recorded it
    reason: str = ""              # the scheduler's reason, in words a person can read
    failed_nodes: tuple[str, ...] = ()  # of a job that ended NODE_FAIL: its nodes the scheduler holds down

    @property
    def alive(self) -> bool:
        return self.state in JobStates.ACTIVE

    @property
    def running(self) -> bool:
        return self.state == JobStates.RUNNING


class Launcher(Protocol):
    kind: str
    # The longest a submit may take before it gives up; a launch claimed longer ago than this (and a margin)
    # belongs to a worker that died while submitting.
    start_timeout_s: float

    def submit(self, request: JobRequest) -> StartedJob:
        """Start the trainer for the spec.json in the request's folder."""

    def find(self, request: JobRequest) -> str | None:
        """The id of a job already submitted for this run and attempt (a launch repeated after a crash), or None."""

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        """The state of every job, with one scheduler call for all of them; a job missing from the answer is
        unknown this time (asked again on the next pass)."""

    def cancel(self, job: Job) -> None:
        """Ask the job to stop (SIGTERM: the trainer saves a checkpoint and exits); forcibly after a grace."""

    def log_paths(self, job: Job) -> list[Path]:
        """The files the job's output goes to, besides the trainer's own logs/rank-N.log."""
