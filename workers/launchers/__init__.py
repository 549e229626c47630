"""How a run's jobs are submitted, watched and stopped: one launcher per cluster kind, one interface (base.py)."""
from .base import (REPORT, CommandRequest, Job, JobRequest, JobState, JobStates, LaunchError, Launcher, SchedulerSettings,
                   StartedJob, job_name, row_stamp)
from .local import LocalLauncher, local_slots
from .slurm_cli import SlurmCLILauncher
from .slurm_rest import SlurmRestLauncher


def launcher_for(settings: SchedulerSettings) -> Launcher:
    if settings.kind == "local":
        return LocalLauncher()
    if settings.kind == "slurm":
        return SlurmCLILauncher()
    if settings.kind == "slurm-rest":
        return SlurmRestLauncher(settings.rest_url)
    raise LaunchError(f"no launcher for clusters of kind {settings.kind!r}: use local, slurm or slurm-rest")


__all__ = ["REPORT", "CommandRequest", "Job", "JobRequest", "JobState", "JobStates", "LaunchError", "Launcher", "LocalLauncher",
           "SchedulerSettings", "SlurmCLILauncher", "SlurmRestLauncher", "StartedJob", "job_name", "launcher_for",
           "local_slots", "row_stamp"]
