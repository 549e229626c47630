"""The process of a job a row follows (a dataset's preparation, a checkpoint's evaluation), run to its end here
(``run_job_process``: a process of the worker's, with ``run_deploy_command``) or as a batch job of its own on a
Slurm cluster (``run_cluster_job``); its progress is written to the row either way, and what stops it early is
settled here as a failure."""
import logging
import time
from pathlib import Path
from typing import Callable

from workers.deploy_commands import CommandEnded, CommandStopped, nonblank_lines, run_deploy_command
from workers.launchers import CommandRequest, Job, LaunchError, Launcher
from workers.launchers.sbatch import REPORT

log = logging.getLogger(__name__)

Progress = Callable[[float, str], bool]  # (seconds so far, where it stands) → False once superseded
TAIL_BYTES = 8192  # of the job's output, read for its last line


def run_job_process(what: str, command: list[str], timeout_s: float, progress_every_s: float,
                    progress: Progress, fail: Callable[[str], object],
                    env: dict[str, str] | None = None) -> CommandEnded | str:
    """How the process ended; or, when it did not run to its end, why (already settled through ``fail``, except
    "superseded": another delivery claimed the row and goes on with it)."""
    try:
        return run_deploy_command(command, timeout_s, progress_every_s, progress, env)
    except CommandStopped as stopped:
        if not stopped.timed_out:
            return "superseded"
        message = f"the {what} ran over {timeout_s:.0f} s and was stopped"
    except OSError as exc:
        log.exception("the %s could not start", what)
        message = f"the {what} could not start: {exc}"
    fail(message)
    return message


def run_cluster_job(what: str, launcher: Launcher, request: CommandRequest, timeout_s: float,
                    progress_every_s: float, progress: Progress, fail: Callable[[str], object],
                    submitted: Callable[[str], object]) -> CommandEnded | str:
    """``run_job_process`` for ``request`` as a job of its own on a Slurm cluster: the job submitted, or found by
    its name when an earlier delivery of the task submitted it before it died (``submitted`` is told its id either
    way); followed until it ends (its state
    and the last line it said, every ``progress_every_s``); then its report and exit code. A job running past
    ``timeout_s`` is cancelled. A superseded delivery leaves the job to the delivery that claimed the row."""
    try:
        job_id = launcher.find(request) or launcher.submit(request).job_id
    except LaunchError as exc:
        message = f"the {what} could not be submitted: {exc}"
        fail(message)
        return message
    submitted(job_id)
    job, started = Job(job_id, request.run_dir), time.monotonic()
    output = launcher.log_paths(job)[0]
    while True:
        try:
            state = launcher.poll([job]).get(job_id)
        except LaunchError as exc:  # the scheduler did not answer this time: asked again on the next pass
            log.warning("polling Slurm job %s: %s", job_id, exc)
            state = None
        if state is not None and not state.alive:
            break
        elapsed = time.monotonic() - started
        if elapsed > timeout_s:
            launcher.cancel(job)
            message = f"the {what} ran over {timeout_s:.0f} s and its Slurm job {job_id} was cancelled"
            fail(message)
            return message
        said = _last_line(output)
        where = f"Slurm job {job_id} {state.state.lower() if state else 'submitted'}"
        if state is not None and state.reason and not state.running:
            where += f" ({state.reason})"
        if not progress(elapsed, f"{where}: {said}" if said else where):
            return "superseded"
        time.sleep(progress_every_s)
    errors = nonblank_lines(_tail(output))
    if state.exit_code is None:
        errors.append(f"Slurm job {job_id} ended {state.state} without an exit code" +
                      (f": {state.reason}" if state.reason else ""))
    report = request.run_dir / REPORT
    return CommandEnded(state.exit_code if state.exit_code is not None else -1,
                        report.read_text() if report.exists() else "", errors)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(path: Path) -> str:
    lines = nonblank_lines(_tail(path))
    return lines[-1] if lines else ""
