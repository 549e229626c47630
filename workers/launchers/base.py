"""The one interface every launcher implements: submit, find, poll many jobs at once, cancel, where the logs are,
the scheduler's accounting of ended jobs, and how many ranks the launcher itself has room for.

A launcher knows nothing of the database: it is given a ``JobRequest`` (the run, the attempt, its folder, its spec
and the cluster's scheduler settings) or a ``CommandRequest`` (one command, run once: a dataset's preparation, an
evaluation, a conversion) and answers with job ids and ``JobState``s. The workers decide what a state means for the
run or the job's row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, runtime_checkable

from trainer.contract import RunSpec

if TYPE_CHECKING:  # the accounting's module reads JobStates from here
    from .slurm_accounting import JobRecord


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
    made: str = ""  # when the run's row was made (``row_stamp``): what sets it apart from another database's run

    @property
    def job_name(self) -> str:
        """Names the run and the attempt, so that a launch repeated after a crash finds the job it submitted."""
        return job_name(self.run_id, self.attempt, self.made)


@dataclass(frozen=True)
class CommandRequest:
    """One command run once as a job of its own, on one node (a dataset's preparation, an evaluation, a
    conversion): no ranks, no attempts. Its standard output goes to REPORT in its folder, its standard error to the
    job's output (``Launcher.log_paths``).

    The launchers read ``job_name``, ``run_dir`` and ``settings`` of it as of a run's ``JobRequest``: the same
    look-up by name after a crash, the same script and output files in the folder."""

    job_name: str
    run_dir: Path             # the job's folder: its script, the job's output (the command's stderr), REPORT
    command: tuple[str, ...]
    settings: SchedulerSettings
    cpus: int = 1
    mounts: tuple[str, ...] = ()  # folders a container must see besides the code and run_dir (the command's data)
    # added to the command's environment where it runs on this machine (a secret: never on the command line, which
    # every user of the machine can read); a Slurm launcher refuses it rather than write it into a batch script
    env: Mapping[str, str] = field(default_factory=dict)


REPORT = "report.out"  # a command job's standard output, in its folder


def row_stamp(made) -> str:
    """When a row was made, as a job's name carries it: a row of another database with the same id (a second
    workbench on the cluster, a restored one) names its jobs otherwise, so neither adopts the other's job."""
    return f"{made:%Y%m%d%H%M%S%f}"


def job_name(run_id: int, attempt: int, made: str = "") -> str:
    return f"wb-run{run_id}-{made}-a{attempt}" if made else f"wb-run{run_id}-a{attempt}"


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


@runtime_checkable
class Launcher(Protocol):
    kind: str
    label: str  # what a person calls its jobs: "local job", "Slurm job"
    # The longest a submit may take before it gives up; a launch claimed longer ago than this (and a margin)
    # belongs to a worker that died while submitting.
    start_timeout_s: float
    calls: list[list[str]]  # every call this launcher made to its scheduler (none for the local one)

    def submit(self, request: JobRequest | CommandRequest) -> StartedJob:
        """Start the trainer for the spec.json in the request's folder, or the request's command."""

    def find(self, request: JobRequest | CommandRequest) -> str | None:
        """The id of a job already submitted for this request (a launch repeated after a crash), or None."""

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        """The state of every job, with one scheduler call for all of them; a job missing from the answer is
        unknown this time (asked again on the next pass)."""

    def cancel(self, job: Job) -> None:
        """Ask the job to stop (SIGTERM: the trainer saves a checkpoint and exits); forcibly after a grace."""

    def log_paths(self, job: Job) -> list[Path]:
        """The files the job's output goes to, besides the trainer's own logs/rank-N.log."""

    def accounting(self, job_ids: list[str]) -> dict[str, JobRecord]:
        """The scheduler's record of each ended job (steps, exit codes, times, peak memory); none where it keeps
        no accounting."""

    def capacity(self) -> int | None:
        """How many ranks this launcher may run at once, where it must count them itself (a machine's CPU slots);
        None where a scheduler queues what does not fit."""
