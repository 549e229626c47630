"""The run command's supervisor: starts the product's long-running processes and keeps them running.

    python scripts/supervisor.py [--banner TEXT | --banner -] \
        --child "a Celery worker with beat (log: var/log/worker.log)" var/log/worker.log celery -A … \
        --child "the web server" - python manage.py runserver …

Each ``--child`` is what it is (printed as it starts: "== starting <that>"; its name is the text before " ("), where
its output goes ("-": this terminal; a file is emptied at the first start and appended to at a restart) and its
command line. Each child runs in a session of its own, so that a Ctrl-C at the terminal reaches this supervisor
alone, which then stops the children itself, and so that what a child started can be found and killed with it.

- A child that ends while the product runs is started again after a backoff (RESTART_DELAYS_S: 1, 2, 4 … 30 s;
  from the first again once it had run STABLE_S), with a line saying how it ended; what was left of its process
  group is killed first. The other children are not touched.
- SIGINT (Ctrl-C) or SIGTERM stops them all: SIGTERM to each child, SIGKILL to whatever of its process group still
  runs GRACE_S later.
- A child gets SIGTERM if the supervisor itself is killed (PR_SET_PDEATHSIG), so none outlives the run command.
- ``--banner -`` reads the banner from standard input: what it holds (the run command's one-time sign-in link) then
  never stands on a command line, which any local user can read (``ps``).

Standard library only: it runs commands and knows nothing of what they are.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Optional

RESTART_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
STABLE_S = 60.0   # a child that ran this long before it ended is restarted after the first delay again
GRACE_S = 20.0    # how long a stopped child may take to finish (a Celery worker ends its running tasks first)
POLL_S = 0.1
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _terminated_with_the_supervisor() -> None:
    """In the child, before exec: SIGTERM when the supervisor ends, however it ends."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # nothing of the group is left
        pass


def how_it_ended(returncode: int) -> str:
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"


@dataclass
class Child:
    description: str                  # "a Celery worker with beat (log: var/log/worker.log)"
    command: list[str]
    log: Optional[Path] = None        # None: the supervisor's own output
    process: Optional[subprocess.Popen] = None
    started_at: float = 0.0
    ends_in_a_row: int = 0            # ends, each after less than STABLE_S of running
    restart_at: Optional[float] = None
    starts: int = 0

    @property
    def name(self) -> str:
        return self.description.split(" (")[0]

    def start(self, now: float) -> None:
        out = None
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log, "ab" if self.starts else "wb")
        try:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT if out else None,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_terminated_with_the_supervisor)
        finally:
            if out is not None:
                out.close()
        self.started_at, self.restart_at, self.starts = now, None, self.starts + 1


@dataclass
class Supervisor:
    children: list[Child]
    delays_s: tuple[float, ...] = RESTART_DELAYS_S
    stable_s: float = STABLE_S
    grace_s: float = GRACE_S
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    clock: Callable[[], float] = time.monotonic  # what a child's running time and its backoff are measured by
    stopping: bool = False

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def start_all(self) -> None:
        for child in self.children:
            self.say(f"== starting {child.description}")
            self._start(child)

    def _start(self, child: Child) -> None:
        try:
            child.start(self.clock())
        except OSError as exc:  # a command that cannot be run at all: tried again, later and later
            self._restart_later(child, 0.0, f"could not be started ({exc})")

    def _restart_later(self, child: Child, ran_s: float, what: str) -> None:
        child.ends_in_a_row = 1 if ran_s >= self.stable_s else child.ends_in_a_row + 1
        delay = self.delays_s[min(child.ends_in_a_row, len(self.delays_s)) - 1]
        child.process, child.restart_at = None, self.clock() + delay
        self.say(f"== {child.name} {what}; starting it again in {delay:g} s"
                 + (f" (its log: {child.log})" if child.log else ""))

    def watch_once(self) -> None:
        """Restart what has ended and is due."""
        now = self.clock()
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                _kill_group(child.process.pid)  # what it started and left behind
                ran_s = now - child.started_at
                self._restart_later(child, ran_s, f"ended ({how_it_ended(child.process.returncode)}) after "
                                                  f"{ran_s:.0f} s")
            elif child.process is None and child.restart_at is not None and now >= child.restart_at:
                self._start(child)

    def stop_all(self) -> None:
        self.say("\n== stopping")
        running = [c.process for c in self.children if c.process is not None]
        for process in running:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + self.grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _kill_group(process.pid)
            process.wait()

    def request_stop(self, *_) -> None:
        self.stopping = True

    def run(self, banner: str = "", handle_signals: bool = True) -> int:
        if handle_signals:
            signal.signal(signal.SIGINT, self.request_stop)
            signal.signal(signal.SIGTERM, self.request_stop)
        try:
            self.start_all()
            if banner:
                self.say(banner)
            while not self.stopping:
                self.watch_once()
                time.sleep(POLL_S)
        finally:
            self.stop_all()
        return 0


def parse_children(argv: list[str], stdin: IO[str] = sys.stdin) -> tuple[str, list[Child]]:
    """``[--banner TEXT | --banner -] (--child DESCRIPTION LOG COMMAND...)...`` → the banner (``-``: read from
    ``stdin``) and the children."""
    banner = ""
    if argv[:1] == ["--banner"] and len(argv) >= 2:
        banner, argv = argv[1], argv[2:]
        if banner == "-":
            banner = stdin.read()
    children, groups = [], []
    for arg in argv:
        if arg == "--child":
            groups.append([])
        elif groups:
            groups[-1].append(arg)
        else:
            raise ValueError(f"{arg!r}: every child starts with --child")
    for group in groups:
        if len(group) < 3:
            raise ValueError(f"--child {' '.join(group)}: give its description, its log file (or -) and its command")
        description, log, *command = group
        children.append(Child(description, command, None if log == "-" else Path(log)))
    if not children:
        raise ValueError("nothing to supervise: give at least one --child")
    return banner, children


def main(argv: list[str]) -> int:
    try:
        banner, children = parse_children(argv)
    except ValueError as exc:
        print(f"error: {exc}\n{__doc__.split(chr(10) + chr(10))[1]}", file=sys.stderr)
        return 2
    return Supervisor(children).run(banner)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
