"""A local Triton Inference Server, started and stopped by the workbench, with explicit model control.

    python -m deploy triton --repository var/triton-models [--http-port 8000 --grpc-port 8001 --metrics-port 8002]

The server is the real ``tritonserver`` 2.51 that the nvidia-pytriton wheel carries, with its Python backend; on a
machine without a GPU it serves ``KIND_CPU`` models. What it needs, all arranged here:
- a backend folder holding ``libtriton_python.so``, ``triton_python_backend_utils.py`` and the backend stub built
  for this interpreter's version;
- PATH starting with this environment's ``bin`` (the stub runs the models in the Python it finds there, so they see
  torch, tokenizers and safetensors), and LD_LIBRARY_PATH with the wheel's libraries and this interpreter's libdir
  (without which the stub may load another libpython).
Models are loaded and unloaded only when asked (``deploy.client``), never at start: a broken model in the
repository never stops the server. The same client drives a remote Triton by its URLs.

The server runs in a process group of its own, which its Python-backend stubs (its child processes) share: however it
ends, even killed with SIGKILL, what is left of the group is killed, so no stub of a server that is gone keeps its
model's memory. ``python -m deploy triton`` also has the server die with it (PR_SET_PDEATHSIG) and, at start, kills
the group a server of the same work folder left behind; it exits with status 1 when the server ends by itself, so
that whoever supervises it (the run command) starts it again.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from deploy.client import TritonClient


def _wheel_root() -> Path:
    import pytriton

    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def backend_directory(target: Path) -> Path:
    """``target/python``: the Python backend with the stub for this interpreter (made once, kept)."""
    root = _wheel_root()
    python = Path(target) / "python"
    python.mkdir(parents=True, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise FileNotFoundError(f"nvidia-pytriton has no Python backend stub for Python {version} ({stub})")
    for source in (root / "backends/python/libtriton_python.so", root / "backends/python/triton_python_backend_utils.py",
                   stub):
        if not (python / source.name).is_file():
            shutil.copy2(source, python / source.name)
    return Path(target)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports nothing listens on now (all held open together, so none is given twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def server_environment() -> dict[str, str]:
    env = dict(os.environ)
    libs = [str(_wheel_root().parent.parent / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    env["LD_LIBRARY_PATH"] = ":".join([p for p in libs if p] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
READY_POLL_TIMEOUT_S = 2.0
PROCESS_NAMES = ("tritonserver", "triton_python_b")  # /proc/<pid>/comm: the server, its stubs (cut at 15 bytes)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    name: str    # /proc/<pid>/comm
    state: str   # R, S, Z (a zombie: ended, not yet reaped) …
    ppid: int
    pgid: int


def process_table() -> list[ProcessInfo]:
    """Every process of this machine, from /proc (Linux)."""
    table = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while the table was read
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        table.append(ProcessInfo(int(entry.name), name, rest[0], int(rest[1]), int(rest[2])))
    return table


def group_members(pgid: int) -> list[ProcessInfo]:
    """The live processes of process group ``pgid`` (zombies have ended: they only wait to be reaped)."""
    return [p for p in process_table() if p.pgid == pgid and p.state != "Z"]


def kill_group(pgid: int, timeout_s: float = 5.0) -> int:
    """SIGKILL whatever is left of process group ``pgid`` and wait until none of it runs; how many were left."""
    left = group_members(pgid)
    if left:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return 0
        deadline = time.monotonic() + timeout_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    return len(left)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it ends, whatever way it ends."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class LocalTriton:
    repository: Path
    work_dir: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    process: Optional[subprocess.Popen] = None
    die_with_parent: bool = False  # the server is SIGKILLed when the process that started it ends

    @classmethod
    def on_free_ports(cls, repository: Path, work_dir: Path, host: str = "127.0.0.1") -> "LocalTriton":
        return cls(Path(repository), Path(work_dir), *free_ports(3, host), host)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def log_path(self) -> Path:
        return Path(self.work_dir) / "tritonserver.log"

    @property
    def group_file(self) -> Path:
        """The running server's process group, so that a start finds what a server of this folder left behind."""
        return Path(self.work_dir) / "tritonserver.pgid"

    def kill_left_behind(self) -> int:
        """Kill the process group a server of this work folder left (its starter was SIGKILLed, and its stubs, or the
        server itself, outlived it); how many processes were left. Only a group whose processes are Triton's."""
        try:
            pgid = int(self.group_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0
        members = group_members(pgid)
        if members and all(p.name in PROCESS_NAMES for p in members):
            return kill_group(pgid)
        return 0

    def client(self, timeout_s: float = 60.0) -> TritonClient:
        return TritonClient(self.http_url, self.grpc_url, self.metrics_url, timeout_s)

    def command(self) -> list[str]:
        backends = backend_directory(Path(self.work_dir) / "backends")
        return [str(_wheel_root() / "bin" / "tritonserver"), f"--model-repository={Path(self.repository).resolve()}",
                f"--backend-directory={backends}", "--model-control-mode=explicit",
                f"--http-address={self.host}", f"--grpc-address={self.host}", f"--metrics-address={self.host}",
                f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                f"--metrics-port={self.metrics_port}", "--allow-gpu-metrics=false", "--exit-on-error=false",
                # a client's idle keep-alive connection would hold the shutdown for the default 30 s
                "--exit-timeout-secs=5"]

    def start(self, timeout_s: float = 60.0) -> "LocalTriton":
        Path(self.repository).mkdir(parents=True, exist_ok=True)
        Path(self.work_dir).mkdir(parents=True, exist_ok=True)
        self.kill_left_behind()
        log = open(self.log_path, "ab")
        # a session of its own: its stubs share its process group, which stop() kills whole
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=server_environment(), start_new_session=True,
                                        preexec_fn=_die_with_parent if self.die_with_parent else None)
        log.close()
        self.group_file.write_text(f"{self.process.pid}\n")
        # Asked briefly: a stub inherits the connections its server had accepted when it started it, so a request
        # on such a connection to a server killed since is answered by nobody until the stub is killed too.
        deadline = time.monotonic() + timeout_s
        with self.client(READY_POLL_TIMEOUT_S) as client:
            while not client.server_ready():
                if self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"tritonserver exited with {self.process.returncode} at start; its last "
                                       f"lines:\n" + self._tail())
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"tritonserver was not ready within {timeout_s:.0f} s; its last lines:\n"
                                       + self._tail())
                time.sleep(0.1)
        return self

    def _tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (Triton unloads its models, whose stubs and shared memory go with them), then SIGKILL; then
        whatever is left of its process group is killed: the stubs of a server that was killed outright, which
        would otherwise run on, orphaned. How many processes were left over."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:  # it ended just now
                self.process.wait()
        left = kill_group(self.process.pid)
        self.group_file.unlink(missing_ok=True)
        return left

    def ended(self) -> str:
        """How the server ended, in words ('' while it runs)."""
        code = None if self.process is None else self.process.poll()
        if code is None:
            return ""
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", required=True, help="the model repository folder (created if missing)")
    parser.add_argument("--work-dir", default="", help="backend folder and log (default: beside the repository)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)


def run(args: argparse.Namespace) -> int:
    """Run a local Triton server (explicit model control) until interrupted; status 1 if it ends by itself."""
    repository = Path(args.repository)
    server = LocalTriton(repository, Path(args.work_dir or repository.parent / "triton"), args.http_port,
                         args.grpc_port, args.metrics_port, args.host, die_with_parent=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        left = server.kill_left_behind()
        if left:
            print(f"killed {left} process(es) a Triton server of {server.work_dir} had left behind", flush=True)
        server.start()
        print(f"Triton ready: HTTP {server.http_url}, gRPC {server.grpc_url}, metrics {server.metrics_url}; "
              f"log {server.log_path}", flush=True)
        while not stopping and server.process.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        stopping.append(True)
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        server.stop()
        return 2
    ended = "" if stopping else server.ended()
    left = server.stop()
    if ended:
        print(f"error: tritonserver ended ({ended}); {left} process(es) of it were left and have been killed; its "
              f"log: {server.log_path}", file=sys.stderr, flush=True)
        return 1
    return 0
