"""The run command's supervisor (scripts/supervisor.py), run as the run command runs it: stand-in children where what
they are does not matter, the real ``python -m deploy triton`` where it does. A child that ends is started again and
the others are not touched; SIGINT (Ctrl-C) and SIGTERM stop all; a Triton killed with SIGKILL leaves no stub."""
from __future__ import annotations

import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from deploy.client import TritonClient
from deploy.triton import free_ports, group_members, process_table
from tests.conftest import REPO

SUPERVISOR = REPO / "scripts" / "supervisor.py"


def _module():
    spec = importlib.util.spec_from_file_location("supervisor", SUPERVISOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


supervisor = _module()


class Running:
    """The supervisor as a process, its output collected as it comes."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen([sys.executable, str(SUPERVISOR), *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True,
                                        env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def children(self) -> dict[str, int]:
        """The supervisor's live children by command name (/proc/<pid>/comm) → pid."""
        return {p.name: p.pid for p in process_table() if p.ppid == self.process.pid and p.state != "Z"}

    def until(self, what, seconds: float, why: str):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            answer = what()
            if answer:
                return answer
            time.sleep(0.05)
        pytest.fail(f"{why} within {seconds} s; the supervisor said:\n" + "\n".join(self.lines))


@contextmanager
def running(*args: str, env: dict[str, str] | None = None):
    run = Running(list(args), env)
    try:
        yield run
    finally:
        if run.process.poll() is None:  # a test that failed half-way: its children go with it
            run.process.terminate()
            try:
                run.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.process.wait()


def _alive(pid: int) -> bool:
    return any(p.pid == pid and p.state != "Z" for p in process_table())


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_killed_child_is_started_again_alone_and_a_stop_signal_stops_them_all(stop):
    with running("--banner", "all started",
                 "--child", "a sleeper (log: -)", "-", "sleep", "600",
                 "--child", "a cat", "-", "sh", "-c", "exec tail -f /dev/null") as run:
        # by their commands: the cat is "sh" until it has exec'd tail
        first = run.until(lambda: {"sleep", "tail"} <= set(run.children()) and run.children(), 10,
                          "both children did not start")
        assert run.until(lambda: "all started" in run.lines, 5, "no banner")
        os.kill(first["sleep"], signal.SIGKILL)
        again = run.until(lambda: run.children().get("sleep") not in (None, first["sleep"]) and run.children(), 10,
                          "the killed child was not started again")
        assert again["tail"] == first["tail"]  # the other child was not touched
        said = re.compile(r"== a sleeper ended \(killed by signal 9\) after \d+ s; starting it again in 1 s")
        assert any(said.fullmatch(line) for line in run.lines), run.lines

        run.process.send_signal(stop)  # Ctrl-C at the terminal, or a stop from outside
        assert run.process.wait(timeout=30) == 0
        assert not any(_alive(pid) for pid in (*again.values(), first["sleep"]))
        assert "== stopping" in run.lines


class ManualClock:
    """The supervisor's clock, moved by the test alone: how long a child ran is what the test says, however slowly
    a loaded machine starts and reaps it."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ends_and_is_due_again(supervised, child, clock, ran_s: float) -> str:
    """Let ``child`` run ``ran_s`` by the clock and end; the supervisor's line about it, once it is started again."""
    clock.now += ran_s
    child.process.wait(timeout=30)  # the event: it has ended
    said = len(supervised.out.getvalue().splitlines())
    supervised.watch_once()
    (line,) = supervised.out.getvalue().splitlines()[said:]
    assert child.process is None and child.restart_at is not None
    clock.now = child.restart_at - 0.01
    supervised.watch_once()
    assert child.process is None, "started again before its delay was over"
    clock.now = child.restart_at
    supervised.watch_once()
    assert child.process is not None, "not started again once its delay was over"
    return line


def test_a_child_that_keeps_ending_is_started_again_later_and_later(tmp_path):
    clock = ManualClock()
    crasher = supervisor.Child("a crasher", ["sh", "-c", "exit 3"], log=tmp_path / "crasher.log")
    supervised = supervisor.Supervisor([crasher], delays_s=(1.0, 2.0, 4.0), stable_s=60.0, out=io.StringIO(),
                                       clock=clock)
    supervised.start_all()
    lines = [_ends_and_is_due_again(supervised, crasher, clock, ran_s=0.5) for _ in range(5)]
    assert lines == [f"== a crasher ended (exit status 3) after 0 s; starting it again in {delay} s "
                     f"(its log: {crasher.log})" for delay in ("1", "2", "4", "4", "4")]
    # one that ran longer than stable_s before it ended starts again after the first delay
    assert _ends_and_is_due_again(supervised, crasher, clock, ran_s=61.0).endswith(
        "after 61 s; starting it again in 1 s (its log: %s)" % crasher.log)
    assert _ends_and_is_due_again(supervised, crasher, clock, ran_s=0.5).endswith(
        "starting it again in 2 s (its log: %s)" % crasher.log)
    supervised.stop_all()


def test_it_refuses_a_command_line_without_children():
    with pytest.raises(ValueError, match="every child starts with --child"):
        supervisor.parse_children(["sleep", "1"])
    with pytest.raises(ValueError, match="its description, its log file"):
        supervisor.parse_children(["--child", "a sleeper", "-"])
    banner, children = supervisor.parse_children(["--banner", "hi", "--child", "a (log: x)", "x.log", "sleep", "1"])
    assert banner == "hi" and children[0].name == "a" and children[0].log == Path("x.log")
    banner, _ = supervisor.parse_children(["--banner", "-", "--child", "a", "-", "sleep", "1"],
                                          stdin=io.StringIO("read, not given\n"))
    assert banner == "read, not given\n"


# -- the real Triton ------------------------------------------------------------------------------------------------

ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
ECHO_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy())]) for r in requests]
"""


def _group_in(file: Path) -> int | None:
    try:
        return int(file.read_text())
    except (OSError, ValueError):  # not there, or being written
        return None


def _echo_repository(root: Path) -> Path:
    """A model repository with one tiny Python-backend model: loading it starts a stub, as our models do."""
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (root / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    return root


@pytest.mark.slow
def test_a_tritonserver_killed_outright_is_started_again_and_leaves_no_stub_behind(tmp_path):
    repository, work = _echo_repository(tmp_path / "models"), tmp_path / "triton"
    http, grpc, metrics = free_ports(3)
    group_file = work / "tritonserver.pgid"
    with running("--child", "a local Triton server (log: triton.log)", str(tmp_path / "triton.log"),
                 sys.executable, "-m", "deploy", "triton", "--repository", str(repository), "--work-dir", str(work),
                 "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                 "--child", "the web server", "-", "sleep", "600") as run, \
            TritonClient(f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", timeout_s=60) as client:
        log = tmp_path / "triton.log"
        run.until(lambda: log.is_file() and "Triton ready" in log.read_text(), 60, "Triton was not ready")
        other = run.children()["sleep"]
        client.load("echo")
        server = _group_in(group_file)
        stub = run.until(lambda: [p.pid for p in group_members(server) if p.name == "triton_python_b"], 10,
                         "the model's stub did not start")[0]
        # A stub whose server is gone ends by itself, unless it is stuck (a lock the server held, a busy model):
        # stopped here, it stands for that one, which only its process group's end can reach.
        os.kill(stub, signal.SIGSTOP)
        os.kill(server, signal.SIGKILL)

        restarted = run.until(lambda: _group_in(group_file) not in (None, server) and client.server_ready(), 60,
                              "Triton was not started again")
        assert restarted
        assert not _alive(stub) and not group_members(server)  # nothing of the killed server runs
        assert run.children()["sleep"] == other  # the other child was not touched
        assert any(line.startswith("== a local Triton server ended (exit status 1)") for line in run.lines)
        client.load("echo")  # the new server serves
        new_server = _group_in(group_file)

        run.process.terminate()
        assert run.process.wait(timeout=60) == 0
        assert not group_members(new_server) and not _alive(other)  # a stopped Triton leaves no stub either
