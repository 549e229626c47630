"""The process of a job a row follows (a dataset's preparation, a checkpoint's evaluation): run to its end with
``run_deploy_command``, its progress written to the row; what stops it early is settled here as a failure."""
import logging
from typing import Callable

from workers.deploy_commands import CommandEnded, CommandStopped, run_deploy_command

log = logging.getLogger(__name__)


def run_job_process(what: str, command: list[str], timeout_s: float, progress_every_s: float,
                    progress: Callable[[float, str], bool], fail: Callable[[str], object],
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
