"""Slurm through its own commands, for a web app whose workers run on a login node.

    submit   sbatch --parsable … job.sbatch          (the script is stored in the run folder and on the run)
    find     squeue --name=<run and attempt>          (a launch repeated after a crash finds the job it submitted)
    poll     one squeue for every active job; jobs that have left squeue: one sacct, if accounting is there; a
             job that ended NODE_FAIL: sinfo, for which of its nodes failed
    cancel   scancel
    account  one sacct for the jobs that ended in a pass: steps, exit codes, times, peak memory, who cancelled
"""
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, Sequence

from .base import Job, JobState, LaunchError, StartedJob
from .sbatch import output_pattern
from .slurm_accounting import JobRecord, parse_sacct, sacct_arguments
from .slurm_jobs import (SlurmRequest, forgotten_job_state, output_log, recorded_exit_code, started_job_id,
                         with_failed_nodes, with_memory_kills, write_batch_script)
from .slurm_states import exit_status, job_state

# What a job's environment starts with; the script sets the rest. The worker's own environment (its database URL,
# its secret key) never reaches a job.
EXPORTED = "PATH,HOME,USER,LANG,LC_ALL,TZ,SLURM_CONF"


class SlurmCommandError(LaunchError):
    pass


class SlurmCLILauncher:
    kind = "slurm"
    label = "Slurm job"
    start_timeout_s = 60.0  # sbatch answers in well under a second when slurmctld is up
    command_timeout_s = 30.0

    def __init__(self):
        self.calls: list[list[str]] = []  # every scheduler command this launcher ran (the batching is tested)

    def _slurm(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        if shutil.which(argv[0]) is None:
            raise SlurmCommandError(f"{argv[0]} is not on this worker's PATH: run the workers on a Slurm login node "
                                    f"(or use a slurm-rest cluster, which talks to slurmrestd instead)")
        self.calls.append(list(argv))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.command_timeout_s,
                                  env=_without_token(os.environ))
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(f"{argv[0]} did not answer within {self.command_timeout_s:.0f} s: is slurmctld "
                                    f"up?") from None
        if check and done.returncode != 0:
            raise SlurmCommandError(f"{' '.join(argv[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def submit(self, request: SlurmRequest) -> StartedJob:
        path, script = write_batch_script(request)
        command = ["sbatch", "--parsable", f"--export={EXPORTED}", f"--output={output_pattern(request.run_dir)}",
                   f"--chdir={request.run_dir}", str(path)]
        job_id = self._slurm(*command).stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmCommandError(f"sbatch answered {job_id!r}, not a job id")
        return StartedJob(job_id=job_id, command=command, script=script)

    def find(self, request: SlurmRequest) -> str | None:
        done = self._slurm("squeue", "--noheader", "--states=all", f"--name={request.job_name}", "--format=%i")
        ids = done.stdout.split()
        return ids[0] if ids else started_job_id(request)

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobState]:
        if not jobs:
            return {}
        by_id = {job.job_id: job for job in jobs}
        done = self._slurm("squeue", "--noheader", "--states=all", f"--jobs={','.join(by_id)}",
                           "--format=%i|%T|%N|%r", check=False)
        states: dict[str, JobState] = {}
        node_lists: dict[str, str] = {}
        for line in done.stdout.splitlines():
            job_id, state, nodes, reason = (line.strip().split("|", 3) + ["", "", ""])[:4]
            if job_id in by_id:
                states[job_id] = job_state(state, reason, recorded_exit_code(by_id[job_id]))
                node_lists[job_id] = nodes
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise SlurmCommandError(f"squeue failed: {done.stderr.strip()}")
        states = with_failed_nodes(states, node_lists, lambda: self._down_nodes(node_lists.values()))
        left = [job for job_id, job in by_id.items() if job_id not in states]
        if left:
            states.update(self._from_accounting(left))
        return with_memory_kills(states, by_id)

    def _down_nodes(self, node_lists: Iterable[str]) -> set[str]:
        """Which of these nodes Slurm holds down, drained, failing or not responding (a job's NODE_FAIL names none)."""
        done = self._slurm("sinfo", "--noheader", "--Node", f"--nodes={','.join(n for n in node_lists if n)}",
                           "--states=down,drain,fail,no_respond", "--format=%N", check=False)
        return set(done.stdout.split())

    def _from_accounting(self, jobs: list[Job]) -> dict[str, JobState]:
        """Jobs squeue no longer shows: sacct's record if accounting is configured, else what the job wrote."""
        states = {}
        if shutil.which("sacct"):
            done = self._slurm("sacct", "--noheader", "--parsable2", "--allocations",
                               f"--jobs={','.join(job.job_id for job in jobs)}", "--format=JobIDRaw,State,ExitCode",
                               check=False)
            for line in done.stdout.splitlines() if done.returncode == 0 else []:
                job_id, state, code = (line.split("|") + ["", ""])[:3]
                states[job_id] = job_state(state, "", exit_status(code))
        for job in jobs:
            if job.job_id not in states:
                states[job.job_id] = forgotten_job_state(job, "Slurm no longer knows the job and keeps no accounting")
        return states

    def accounting(self, job_ids: list[str]) -> dict[str, JobRecord]:
        """Slurm's accounting record of each ended job (none where the cluster keeps no accounting)."""
        if not job_ids or shutil.which("sacct") is None:
            return {}
        done = self._slurm("sacct", *sacct_arguments(job_ids), check=False)
        return parse_sacct(done.stdout) if done.returncode == 0 else {}

    def cancel(self, job: Job) -> None:
        self._slurm("scancel", job.job_id, check=False)

    def log_paths(self, job: Job) -> list[Path]:
        return [output_log(job)]

    def capacity(self) -> int | None:
        return None  # Slurm queues a job until its nodes are free



def _without_token(environ) -> dict[str, str]:
    """A slurmrestd token in the worker's environment stays out of the commands: Slurm passes every SLURM_*
    variable on to the job whatever --export says, and srun inside a job that holds one fails to launch its tasks
    (and the job's user could read it)."""
    return {k: v for k, v in environ.items() if k != "SLURM_JWT"}
