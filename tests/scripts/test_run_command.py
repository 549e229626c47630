"""The run command's processes under its supervisor, on the test database: a Celery worker with beat, the real
``python -m deploy triton`` and the web server. Killing tritonserver outright while a stream is in flight ends the
stream with an error event, leaves the web server and the worker as they were, and Triton comes back with every
deployment that was ready ready again, without anyone acting."""
from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.authtoken.models import Token

from deploy.triton import free_ports, group_members, process_table
from tests.scripts.test_supervisor import running
from tests.webapp import serving
from tests.worker_fixtures import worker_database_url
from webapp.api.serving_serializers import MAX_TOKENS
from webapp.models import Deployment, TritonServer

Status = Deployment.Status


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _child(run, part: str) -> int | None:
    """The pid of the supervisor's child whose command line holds ``part``."""
    for p in process_table():
        if p.ppid == run.process.pid and p.state != "Z" and part in _cmdline(p.pid):
            return p.pid
    return None


def _ready_again(deployment_id: int, after) -> Deployment | None:
    deployment = Deployment.objects.get(pk=deployment_id)
    return deployment if deployment.status == Status.READY and deployment.ready_at > after else None


@pytest.mark.slow
@pytest.mark.once
@pytest.mark.django_db(transaction=True)
def test_a_tritonserver_killed_mid_stream_comes_back_with_its_deployments_and_nothing_else_stops(
        served_checkpoint, redis_url, tmp_path):
    from deploy.export import ExportOptions, export

    web, http_port, grpc_port, metrics_port = free_ports(4)
    repository, work = tmp_path / "models", tmp_path / "triton"
    report = export(served_checkpoint, repository, ExportOptions(name="survivor", measure=False))
    owner = User.objects.create_user("survivor")
    token = Token.objects.create(user=owner).key
    server = TritonServer.objects.create(name="local", http_url=f"http://127.0.0.1:{http_port}",
                                         grpc_url=f"127.0.0.1:{grpc_port}",
                                         metrics_url=f"http://127.0.0.1:{metrics_port}",
                                         model_repository=str(repository))
    # ready before the run command starts, as after a restart: its server has nothing loaded
    deployment = serving.deployment(owner, serving.imported(owner, served_checkpoint), server, "survivor",
                                    report=report, repository_path=report["path"], smoke_ok=True,
                                    ready_at=timezone.now(), claimed_at=timezone.now())
    started = timezone.now()
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": worker_database_url(), "DJANGO_DEBUG": "1",
           "WORKBENCH_VAR": str(tmp_path / "var")}
    args = ["--child", "a Celery worker with beat", str(tmp_path / "worker.log"),
            sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-B", "--pool=solo",
            "--loglevel=INFO", "--without-gossip", "--without-mingle", "--hostname=run-command@%h",
            "--schedule", str(tmp_path / "beat-schedule"),
            "--child", "a local Triton server", str(tmp_path / "triton.log"),
            sys.executable, "-m", "deploy", "triton", "--repository", str(repository), "--work-dir", str(work),
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
            "--child", "the web server", str(tmp_path / "web.log"),
            sys.executable, "manage.py", "runserver", f"127.0.0.1:{web}", "--noreload"]
    with running(*args, env=env) as run:
        ready = run.until(lambda: _ready_again(deployment.pk, started), 240, "the deployment was not loaded")
        assert "again" in ready.status_message
        worker, webserver = _child(run, "celery"), _child(run, "runserver")

        connection = http.client.HTTPConnection("127.0.0.1", web, timeout=120)
        # far more tokens than the few milliseconds each takes could produce before the kill, however late this
        # process reads the first event on a loaded machine (64 tokens were sometimes all sent by then)
        connection.request("POST", f"/api/deployments/{deployment.pk}/generate/",
                           json.dumps({"prompt": report["smoke"]["prompt"], "max_tokens": MAX_TOKENS, "stream": True}),
                           {"Authorization": f"Token {token}", "Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        first = response.readline()  # the first event's first line: generation is under way
        assert first.startswith(b"event: token"), first
        killed_at = timezone.now()
        tritonserver = int((work / "tritonserver.pgid").read_text())
        os.kill(tritonserver, signal.SIGKILL)
        rest = response.read().decode()
        assert "event: error" in rest and "event: done" not in rest, rest
        connection.close()

        again = run.until(lambda: _ready_again(deployment.pk, killed_at), 240,
                          "the deployment was not ready again after Triton's restart")
        assert "again" in again.status_message
        assert not group_members(tritonserver)  # no stub of the killed server
        assert (_child(run, "celery"), _child(run, "runserver")) == (worker, webserver)
        assert any(line.startswith("== a local Triton server ended") for line in run.lines)
