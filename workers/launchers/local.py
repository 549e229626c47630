"""Local launches: torchrun on this machine, one process per rank, detached from the worker."""
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from trainer.contract.command import trainer_command
from trainer.contract.runfolder import SPEC, read_json

from .base import JobState, LaunchError, StartedJob
from .supervise import EXIT_FILE

REPO = Path(__file__).resolve().parents[2]


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/pid/stat), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]


class LocalLauncher:
    """Job ids are ``<pid>:<start time>`` so that a recycled pid is never mistaken for the job."""

    start_timeout_s = 60.0  # the supervisor forks and returns at once; a minute means this machine is stuck

    def start(self, run_dir: Path, nproc: int, resume: bool, env_setup: Sequence[str] = ()) -> StartedJob:
        if any(line.strip() for line in env_setup):
            raise LaunchError("environment setup lines apply to Slurm clusters; clear them on a local cluster")
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1"}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        command = trainer_command(["--spec", str(run_dir / SPEC), *(["--resume"] if resume else [])],
                                  nproc_per_node=nproc)
        try:
            spawn = subprocess.run([sys.executable, "-m", "workers.launchers.supervise", str(run_dir), "--", *command],
                                   cwd=REPO, env=env, capture_output=True, text=True, timeout=self.start_timeout_s)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"the local job's supervisor did not answer within {self.start_timeout_s:.0f} s") \
                from None
        if spawn.returncode != 0 or not spawn.stdout.strip().isdigit():
            raise LaunchError(f"could not start the local job: {spawn.stderr.strip() or spawn.stdout.strip()}")
        pid = int(spawn.stdout.strip())
        started = _start_time(pid)
        return StartedJob(job_id=f"{pid}:{started}" if started else f"{pid}:gone", command=command)

    def poll(self, run_dir: Path, job_id: str) -> JobState:
        pid, _, started = job_id.partition(":")
        alive = started != "gone" and _start_time(int(pid)) == started
        exit_info = read_json(run_dir / EXIT_FILE)
        if exit_info is not None:
            return JobState(alive=False, exit_code=exit_info.get("exit_code"))
        return JobState(alive=alive)

    def stop(self, run_dir: Path, job_id: str) -> None:
        pid, _, started = job_id.partition(":")
        if started == "gone" or _start_time(int(pid)) != started:
            return  # already over
        try:
            os.killpg(int(pid), signal.SIGTERM)  # the supervisor leads its session: every rank gets it
        except ProcessLookupError:
            pass
