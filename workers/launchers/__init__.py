"""How a run's processes are started, watched and stopped: one launcher per cluster kind."""
from .base import JobState, LaunchError, Launcher, StartedJob
from .local import LocalLauncher


def launcher_for(kind: str) -> Launcher:
    if kind == "local":
        return LocalLauncher()
    raise LaunchError(f"no launcher for clusters of kind {kind!r} yet; use a local cluster")


__all__ = ["JobState", "LaunchError", "Launcher", "LocalLauncher", "StartedJob", "launcher_for"]
