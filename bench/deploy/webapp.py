"""The web app as the benchmark reaches it: its OpenAI-compatible /v1 in front of a running Triton, started the way
the run command starts it (``manage.py runserver``), on a SQLite database of its own in a scratch folder.

The web app is a server of its own here, as it is in production, so everything goes through ``manage.py``:
``migrate``, then one ``shell`` command that records the Triton server, a user with an API token, and each served
model as a ready deployment of the checkpoint (what a deploy through the API leaves behind once Triton has loaded
it); then the server. ``with WebApp(...) as web:`` gives ``web.base_url`` and ``web.api_key``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from deploy.triton import free_ports

REPO = Path(__file__).resolve().parents[2]
BENCH_USER = "bench"

# Run by ``manage.py shell -c`` with BENCH_SETUP (JSON) in the environment; prints the API token.
_SETUP = r"""
import json, os
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token
from webapp import models
setup = json.loads(os.environ["BENCH_SETUP"])
user, _ = get_user_model().objects.get_or_create(username=setup["user"])
server, _ = models.TritonServer.objects.update_or_create(name="bench", defaults=dict(
    http_url=setup["http_url"], grpc_url=setup["grpc_url"], metrics_url=setup["metrics_url"],
    model_repository=setup["repository"], is_ready=True, last_seen_at=timezone.now()))
checkpoint, _ = models.Checkpoint.objects.get_or_create(owner=user, name="bench", step=setup["step"],
                                                        path=setup["checkpoint"], manifest=setup["manifest"])
fields = {f.name for f in models.Deployment._meta.get_fields()}
for served in setup["models"]:
    extra = {"engine": served["engine"]} if "engine" in fields else {}
    models.Deployment.objects.create(owner=user, checkpoint=checkpoint, server=server, model_name=served["name"],
                                     status=models.Deployment.Status.READY, report=served["report"], smoke_ok=True,
                                     repository_path=served["path"], ready_at=timezone.now(), **extra)
print("TOKEN=" + Token.objects.get_or_create(user=user)[0].key)
"""


class WebApp:
    """The web server over ``folder`` (its SQLite file and var folder), serving ``models`` — each a dict of name,
    engine, path (the Triton entry) and report (its serving.json) — from the Triton at the given URLs."""

    def __init__(self, folder: Path, triton_urls: dict[str, str], repository: Path, checkpoint: Path,
                 manifest: dict[str, Any], step: int, models: list[dict[str, Any]]):
        self.folder = Path(folder)
        self.setup = {"user": BENCH_USER, **triton_urls, "repository": str(Path(repository).resolve()),
                      "checkpoint": str(Path(checkpoint).resolve()), "manifest": manifest, "step": step,
                      "models": models}
        self.port = free_ports(1)[0]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key = ""
        self.process: Optional[subprocess.Popen] = None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(WORKBENCH_VAR=str(self.folder), DATABASE_URL=f"sqlite:///{self.folder / 'bench.sqlite3'}",
                   DJANGO_DEBUG="1", BENCH_SETUP=json.dumps(self.setup))
        env.pop("DJANGO_CACHE_URL", None)
        return env

    def _manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self._env(), capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout

    def __enter__(self) -> "WebApp":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._manage("migrate", "--noinput", "-v0")
        token_lines = [line for line in self._manage("shell", "-c", _SETUP).splitlines() if line.startswith("TOKEN=")]
        self.api_key = token_lines[-1].split("=", 1)[1]
        log = open(self.folder / "webapp.log", "wb")
        self.process = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}",
                                         "--noreload"], cwd=REPO, env=self._env(), stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready(60.0)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        request = urllib.request.Request(f"{self.base_url}/v1/models",
                                         headers={"Authorization": f"Bearer {self.api_key}"})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the web app did not answer /v1/models within {timeout_s:.0f} s; "
                           f"log: {self.folder / 'webapp.log'}")

    def __exit__(self, *exc_info) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
