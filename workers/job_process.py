"""Following a background job's command to its end, on any cluster (a dataset's preparation, a checkpoint's
evaluation or conversion): ``follow_command`` takes the job's row (webapp.models.jobs.BackgroundJob, claimed by this
delivery) and a ``CommandRequest``, and asks the cluster's launcher to run it as a job of its own: on this machine a
detached process (launchers.local), on a Slurm cluster a batch job (its script from launchers/sbatch.command_script).

The job is submitted, or found by its name when an earlier delivery of the task submitted it before it died; its id
goes on the row; then every ``every_s`` the row says the job's state and the last line the command said. What stops
it early (it could not start, it ran past its time limit) is settled here as a failure; a delivery another one has
superseded leaves the job to it. The caller reads how it ended (``CommandEnded``) and settles the row."""
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings as django_settings

from webapp.models import Cluster
from webapp.models.jobs import BackgroundJob
from webapp.services.job_rows import FAILED, job_progress, job_settle
from webapp.services.runs import runs_root
from workers.deploy_commands import CommandEnded, nonblank_lines
from workers.launchers import REPORT, CommandRequest, Job, LaunchError, SchedulerSettings, launcher_for, row_stamp

log = logging.getLogger(__name__)

TAIL_BYTES = 8192  # of the job's output, read for its last line
SUPERSEDED = "superseded"


@dataclass(frozen=True)
class Following:
    """How a kind of job is followed: what it is called in messages, what it says before its first line."""

    what: str          # "preparation": "the preparation could not start", …
    idle: str          # the row's message until the command says something
    timeout_s: float
    every_s: float = 1.0


def command_job_name(prefix: str, row: BackgroundJob) -> str:
    """``wb-<prefix><id>-<when the row was made>``: every delivery finds the job by that name, and a row of another
    database with the same id (a second workbench on the cluster, a restored one) never takes it for its own."""
    return f"wb-{prefix}{row.pk}-{row_stamp(row.created_at)}"


def command_folder(cluster: Cluster | None, kind: str, name: str) -> Path:
    """The job's folder (its script, its output, its report), under the cluster's runs root, which its nodes and
    the workers share; this machine's runs root without a cluster."""
    root = runs_root(cluster) if cluster is not None else Path(django_settings.WORKBENCH["RUNS_ROOT"])
    folder = root / kind / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def local_settings() -> SchedulerSettings:
    return SchedulerSettings(kind=Cluster.Kind.LOCAL)


def follow_command(row: BackgroundJob, request: CommandRequest, how: Following) -> CommandEnded | str:
    """How the command ended; or, when it did not run to its end, why (already settled on the row, except
    SUPERSEDED: another delivery claimed the row and goes on with the job)."""
    try:
        launcher = launcher_for(request.settings)
        job_id = launcher.find(request) or launcher.submit(request).job_id
    except (LaunchError, OSError) as exc:
        return _fail(row, f"the {how.what} could not start: {exc}")
    if not job_progress(row, f"{launcher.label} {job_id} submitted", job_id=job_id):
        return SUPERSEDED
    job, started = Job(job_id, request.run_dir), time.monotonic()
    output = launcher.log_paths(job)[0]
    while True:
        try:
            state = launcher.poll([job]).get(job_id)
        except LaunchError as exc:  # the scheduler did not answer this time: asked again on the next pass
            log.warning("polling %s %s: %s", launcher.label, job_id, exc)
            state = None
        if state is not None and not state.alive:
            break
        elapsed = time.monotonic() - started
        if elapsed > how.timeout_s:
            launcher.cancel(job)
            return _fail(row, f"the {how.what} ran over {how.timeout_s:.0f} s and its {launcher.label} {job_id} "
                              f"was stopped")
        where = f"{launcher.label} {job_id} {state.state.lower() if state else 'submitted'}"
        if state is not None and state.reason and not state.running:
            where += f" ({state.reason})"
        if not job_progress(row, f"{where}: {_last_line(output) or how.idle} ({elapsed:.0f} s so far)"):
            return SUPERSEDED
        time.sleep(how.every_s)
    errors = nonblank_lines(_tail(output))
    if state.exit_code is None:
        errors.append(f"{launcher.label} {job_id} ended {state.state} without an exit code" +
                      (f": {state.reason}" if state.reason else ""))
    report = request.run_dir / REPORT
    return CommandEnded(state.exit_code if state.exit_code is not None else -1,
                        report.read_text() if report.exists() else "", errors)


def _fail(row: BackgroundJob, message: str) -> str:
    job_settle(row, FAILED, message)
    return message


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
