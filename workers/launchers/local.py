"""Local launches: torchrun on this machine, one process per rank, detached from the worker; or a command run once
(a ``CommandRequest``), detached alike, its standard output in REPORT and its standard error in logs/launcher.log.

Job ids are ``<pid>:<start time>`` (the supervisor's), so that a recycled pid is never mistaken for the job. The
supervisor records the job's name in the run folder as it starts, and how it ended when it ends: ``find`` and
``poll`` read those and the process table, so they need no scheduler and no worker's memory.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from trainer.contract.command import trainer_command
from trainer.contract.runfolder import ATTEMPT_ENV, SPEC, read_json

from .base import REPORT, CommandRequest, Job, JobRequest, JobState, JobStates, LaunchError, StartedJob
from .slurm_accounting import JobRecord
from ..supervise import EXIT_FILE, JOB_FILE, LOG_FILE

REPO = Path(__file__).resolve().parents[2]
CANCEL_GRACE_S = 8.0  # SIGTERM lets the trainer save a checkpoint; what still runs after this is killed


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/pid/stat), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(job_id: str) -> bool:
    pid, _, started = job_id.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == started


def local_slots() -> int:
    """How many ranks may run on this machine at once: WORKBENCH_LOCAL_SLOTS, or one per CPU."""
    value = os.environ.get("WORKBENCH_LOCAL_SLOTS", "")
    return int(value) if value.isdigit() and int(value) > 0 else (os.cpu_count() or 1)


class LocalLauncher:
    kind = "local"
    label = "local job"
    start_timeout_s = 60.0  # the supervisor forks and returns at once; a minute means this machine is stuck

    def __init__(self):
        self.calls: list[list[str]] = []  # no scheduler: always empty

    def submit(self, request: JobRequest | CommandRequest) -> StartedJob:
        if any(line.strip() for line in request.settings.env_setup):
            raise LaunchError("environment setup lines apply to Slurm clusters; clear them on a local cluster")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1"}
        run_dir = request.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        if isinstance(request, CommandRequest):
            command, output = list(request.command), ["--stdout", str(run_dir / REPORT)]
            env.update(request.env)
        else:
            command, output = trainer_command(["--spec", str(run_dir / SPEC), *(["--resume"] if request.resume else [])],
                                              nproc_per_node=request.spec.plan.world_size), []
            env.update({"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), ATTEMPT_ENV: str(request.attempt)})
            env.pop("DJANGO_SETTINGS_MODULE", None)
        try:
            spawn = subprocess.run(
                [sys.executable, "-m", "workers.supervise", str(run_dir), request.job_name, *output, "--",
                 *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=self.start_timeout_s)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"the local job's supervisor did not answer within {self.start_timeout_s:.0f} s") \
                from None
        job_id = spawn.stdout.strip()
        pid, _, started = job_id.partition(":")
        if spawn.returncode != 0 or not (pid.isdigit() and started.isdigit()):
            raise LaunchError(f"could not start the local job: {spawn.stderr.strip() or job_id}")
        return StartedJob(job_id=job_id, command=command)

    def find(self, request: JobRequest | CommandRequest) -> str | None:
        record = read_json(request.run_dir / JOB_FILE)
        if isinstance(record, dict) and record.get("name") == request.job_name:
            return str(record.get("job_id") or "") or None
        return None

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        return {job.job_id: self._state(job) for job in jobs}

    def _state(self, job: Job) -> JobState:
        exit_info = read_json(job.run_dir / EXIT_FILE)
        if isinstance(exit_info, dict) and exit_info.get("job_id") == job.job_id:
            code = exit_info.get("exit_code")
            if code == 0:
                return JobState(JobStates.COMPLETED, 0)
            return JobState(JobStates.FAILED, code, f"the job exited with code {code}; see logs/{LOG_FILE}")
        if _alive(job.job_id):
            return JobState(JobStates.RUNNING)
        return JobState(JobStates.FAILED, None, "the job's processes are gone and left no exit record "
                                                "(killed, or the machine restarted)")

    def cancel(self, job: Job, grace_s: float = CANCEL_GRACE_S) -> None:
        pid = int(job.job_id.partition(":")[0])
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _alive(job.job_id):
                return
            try:
                os.killpg(pid, sig)  # the supervisor leads its session: every rank gets it
            except ProcessLookupError:
                return
            deadline = time.monotonic() + grace_s
            while _alive(job.job_id) and time.monotonic() < deadline:
                time.sleep(0.1)

    def log_paths(self, job: Job) -> list[Path]:
        return [job.run_dir / "logs" / LOG_FILE]

    def accounting(self, job_ids: list[str]) -> dict[str, JobRecord]:
        return {}  # no scheduler keeps a record: the exit record in the folder is all there is

    def capacity(self) -> int | None:
        return local_slots()
