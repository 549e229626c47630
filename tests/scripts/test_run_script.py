"""The run command itself (scripts/run.sh), as a new user starts it, in a folder of its own (WORKBENCH_VAR): its
first start prints a one-time sign-in link on its terminal, and that link stands on no process's command line,
which any local user can read with ``ps``."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from deploy.triton import free_ports, process_table
from tests.conftest import REPO
from tests.scripts.test_supervisor import Running


def _consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports nothing listens on now (Triton's HTTP, gRPC and metrics)."""
    for _ in range(100):
        base = free_ports(1)[0]
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, s in enumerate(sockets):
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    pytest.fail(f"no {count} consecutive free ports found")


class RunCommand(Running):
    """``bash scripts/run.sh`` as a process (it execs the supervisor: the same pid), its output collected."""

    def __init__(self, env: dict[str, str]):
        self.process = subprocess.Popen(["bash", str(REPO / "scripts" / "run.sh")], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True,
                                        env=env, stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.once
def test_the_first_start_shows_the_sign_in_link_on_its_terminal_and_on_no_command_line(redis_url, tmp_path):
    import redis

    # its worker and beat on the Redis database no test's worker listens on (tests.conftest), emptied after
    base, _, number = redis_url.rpartition("/")
    broker = f"{base}/{int(number) - 1}"
    port = free_ports(1)[0]
    env = {**{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SECRET_KEY")},
           "WORKBENCH_VAR": str(tmp_path / "var"), "PORT": str(port), "TRITON_PORT": str(_consecutive_free_ports(3)),
           "REDIS_URL": broker}
    run = RunCommand(env)
    try:
        prefix = f"http://127.0.0.1:{port}/"
        link = run.until(lambda: next((line.strip() for line in run.lines if line.strip().startswith(prefix)
                                       and "signin" in line), None), 180, "no sign-in link was printed")
        assert any(line.startswith("  First sign-in (once, within an hour") for line in run.lines), run.lines
        token = link.rstrip("/").rsplit("/", 1)[-1]
        assert len(token) >= 20, link
        # every process the run command started is there by now: the supervisor prints the banner after starting them
        holders = [p.pid for p in process_table() if token in _cmdline(p.pid)]
        assert holders == [], f"the sign-in link is on the command line of {[_cmdline(pid) for pid in holders]}"
        assert (tmp_path / "var" / "log").is_dir() and (tmp_path / "var" / "workbench.sqlite3").is_file()
    finally:
        run.process.send_signal(signal.SIGINT)  # Ctrl-C at its terminal
        try:
            run.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait()
        redis.Redis.from_url(broker).flushdb()
    assert run.process.returncode == 0, run.lines
