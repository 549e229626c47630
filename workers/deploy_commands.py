"""Running a deployment's ``python -m deploy export`` from a worker task, as a process: the commands need torch,
which the workers never import (import-hf and export-hf run as jobs of their own: workers.job_process); and how
every ``python -m deploy`` command's ending is read (``CommandEnded``).

The commands end as ``deploy.outcome`` says: one JSON report line on stdout and status 0; status 2 when they refuse,
1 when they fail, the reason on the last stderr line ("error: …"). ``run_deploy_command`` waits for the process and
every ``progress_every_s`` hands the task the time so far and the last line the command said (its progress lines
go to stderr, kept in a temporary file so that they can be read while it runs and nothing is lost); the
task writes it where its row says how far it is, and stops the command by returning False (superseded: another
delivery claimed the work). A command that runs past ``timeout_s`` is stopped.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from django.conf import settings

REFUSED = 2  # deploy.outcome's status for a refusal


class CommandStopped(Exception):
    """The command ran past its time limit, or its task asked it to stop."""

    def __init__(self, timed_out: bool):
        super().__init__("timed out" if timed_out else "stopped")
        self.timed_out = timed_out


@dataclass(frozen=True)
class CommandEnded:
    status: int
    stdout: str
    stderr_lines: list[str]

    @property
    def last_error(self) -> str:
        """The last thing the command said on stderr, without its "error: " prefix."""
        return self.stderr_lines[-1].removeprefix("error: ") if self.stderr_lines else ""

    @property
    def stderr_tail(self) -> str:
        return "\n".join(self.stderr_lines)[-2000:]

    @property
    def report_line(self) -> str:
        """The last line on stdout: the command's JSON report when it succeeded."""
        lines = nonblank_lines(self.stdout)
        return lines[-1] if lines else ""


def nonblank_lines(text: str) -> list[str]:
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def run_deploy_command(command: list[str], timeout_s: float, progress_every_s: float,
                       on_progress: Callable[[float, str], bool], env: dict[str, str] | None = None) -> CommandEnded:
    """Run ``command`` to its end (see the module's description), with ``env`` added to the worker's environment
    (a secret is passed there, never on the command line, which every user of the machine can read)."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, cwd=settings.BASE_DIR,
                                   env={**os.environ, **env} if env else None)
        try:
            while True:
                try:
                    out, _ = process.communicate(timeout=progress_every_s)
                    break
                except subprocess.TimeoutExpired:  # no output is lost: communicate is called again
                    elapsed = time.monotonic() - started
                    if elapsed > timeout_s:
                        raise CommandStopped(timed_out=True) from None
                    err.seek(0)
                    said = nonblank_lines(err.read())
                    if not on_progress(elapsed, said[-1] if said else ""):
                        raise CommandStopped(timed_out=False)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
            err.seek(0)
            errors = nonblank_lines(err.read())
    return CommandEnded(process.returncode, out, errors)
