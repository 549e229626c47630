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
"""
from __future__ import annotations

import argparse
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


@dataclass
class LocalTriton:
    repository: Path
    work_dir: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    process: Optional[subprocess.Popen] = None

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
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=server_environment(), start_new_session=True)
        log.close()
        client, deadline = self.client(), time.monotonic() + timeout_s
        while not client.server_ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode} at start; its last lines:\n"
                                   + self._tail())
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

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (Triton unloads its models, whose stubs and shared memory go with them), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", required=True, help="the model repository folder (created if missing)")
    parser.add_argument("--work-dir", default="", help="backend folder and log (default: beside the repository)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)


def run(args: argparse.Namespace) -> int:
    """Run a local Triton server (explicit model control) until interrupted."""
    repository = Path(args.repository)
    server = LocalTriton(repository, Path(args.work_dir or repository.parent / "triton"), args.http_port,
                         args.grpc_port, args.metrics_port, args.host)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        server.start()
        print(f"Triton ready: HTTP {server.http_url}, gRPC {server.grpc_url}, metrics {server.metrics_url}; "
              f"log {server.log_path}", flush=True)
        while not stopping and server.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        server.stop()
    return 0
