"""What the two Slurm launchers (commands and slurmrestd) do alike with a run's batch job: the script stored in the
run folder before it is submitted, the exit code the script records as it ends, where Slurm writes its output, the
state of a job Slurm has forgotten, and the job its script says it was; and what Slurm's state leaves out (the
nodes that failed under a job, a step killed for going over its memory)."""
from dataclasses import replace
from pathlib import Path
from typing import Callable

from trainer.contract.runfolder import LOGS, read_json

from .base import CommandRequest, Job, JobRequest, JobState, JobStates, LaunchError
from .sbatch import UnsafeScriptValue, batch_script, command_script, output_pattern
from .slurm_states import expand_hostlist
from ..supervise import EXIT_FILE, JOB_FILE

SCRIPT = "job.sbatch"
SlurmRequest = JobRequest | CommandRequest  # what the Slurm launchers submit and find: a run's attempt or a command


def write_batch_script(request: SlurmRequest) -> tuple[Path, str]:
    """The attempt's (or the command's) batch script, rendered and written to its folder: (its path, its text). The
    exit record of an earlier attempt is removed, so that it is never taken for this attempt's."""
    if isinstance(request, CommandRequest) and request.env:
        raise LaunchError(f"the command's environment ({', '.join(sorted(request.env))}) is given only on this "
                          f"machine: a batch script would hold it for every user of the cluster to read")
    try:
        script = command_script(request) if isinstance(request, CommandRequest) else batch_script(request)
    except UnsafeScriptValue as exc:
        raise LaunchError(str(exc)) from None
    path = request.run_dir / SCRIPT
    path.write_text(script)
    (request.run_dir / LOGS).mkdir(exist_ok=True)
    (request.run_dir / EXIT_FILE).unlink(missing_ok=True)
    return path, script


def started_job_id(request: SlurmRequest) -> str | None:
    """The id of this attempt's job as its script recorded it when it started: a launch repeated after Slurm has
    forgotten the job (MinJobAge, 300 s by default) still finds it."""
    record = read_json(request.run_dir / JOB_FILE)
    if isinstance(record, dict) and record.get("name") == request.job_name and str(record.get("job_id")).isdigit():
        return str(record["job_id"])
    return None


def recorded_exit_code(job: Job) -> int | None:
    """The step's exit code as the batch script recorded it (absent when the job was killed)."""
    record = read_json(job.run_dir / EXIT_FILE)
    if isinstance(record, dict) and str(record.get("job_id")) == job.job_id:
        return record.get("exit_code")
    return None


def forgotten_job_state(job: Job, why: str) -> JobState:
    """A job the scheduler no longer knows (``why`` says how that is known): GONE, with what its script recorded."""
    code = recorded_exit_code(job)
    ended = f"its script exited with {code}" if code is not None else "it ended without an exit record"
    return JobState(JobStates.GONE, code, f"{why}; {ended}")


def output_log(job: Job) -> Path:
    """The file Slurm writes the batch script's output to."""
    return Path(output_pattern(job.run_dir).replace("%j", job.job_id))


def with_failed_nodes(states: dict[str, JobState], node_lists: dict[str, str],
                      down_nodes: Callable[[], set[str]]) -> dict[str, JobState]:
    """Each job that ended NODE_FAIL with the nodes of its list (``node_lists``, Slurm's host lists by job) that
    ``down_nodes`` says Slurm holds down: Slurm's NODE_FAIL names none. The scheduler is asked only when such a job
    is there."""
    failed = [job_id for job_id, state in states.items() if state.state == JobStates.NODE_FAIL]
    if not failed:
        return states
    down = down_nodes()
    return {**states, **{job_id: replace(states[job_id], failed_nodes=tuple(
        sorted(set(expand_hostlist(node_lists.get(job_id, ""))) & down))) for job_id in failed}}


# What slurmstepd writes to a job's output when it kills a step for its memory: over the limit it reads every
# accounting period (JobAcctGatherParams=OverMemoryKill), or the kernel's OOM killer in the job's cgroup
MEMORY_KILLED = ("exceeded memory limit", "Exceeded job memory limit", "oom_kill event", "oom-kill event")
OUTPUT_TAIL_BYTES = 64 * 1024


def with_memory_kills(states: dict[str, JobState], jobs: dict[str, Job]) -> dict[str, JobState]:
    """Each job that ended FAILED or CANCELLED because slurmstepd killed a step for its memory, as OUT_OF_MEMORY:
    Slurm says so itself only where a cgroup's OOM killer did it."""
    out = dict(states)
    for job_id, state in states.items():
        if state.state in (JobStates.FAILED, JobStates.CANCELLED) and job_id in jobs:
            said = next((line for line in _output_tail(jobs[job_id]) if any(m in line for m in MEMORY_KILLED)), None)
            if said:
                out[job_id] = replace(state, state=JobStates.OUT_OF_MEMORY, reason=said.strip())
    return out


def _output_tail(job: Job) -> list[str]:
    try:
        with open(output_log(job), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - OUTPUT_TAIL_BYTES))
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
