"""Deploying a checkpoint on a Triton server and unloading it (the tasks workbench.deployments.deploy and
workbench.deployments.undeploy).

    pending → exporting   ``python -m deploy export`` writes the model into the server's model repository. It is a
                          subprocess: the export needs torch, which the workers never import. Its one-line JSON
                          report is kept on the deployment; the status message shows how long it has run.
            → loading     Triton loads the model (explicit model control) and is asked until it says it is ready.
            → ready       the smoke check passed: the served model's greedy tokens for the report's prompt are the
                          checkpoint's own (``report["smoke"]["token_ids"]``), so the export changed nothing.
    any failure → failed, with a message that says what to change.

    ready → reloading     the reconcile pass saw the deployment's server up without its model (a restarted server
                          loads nothing by itself: webapp.services.serving_state) and sent the task again;
          → ready         loaded again from its entry (``repository_path``: no export) and smoke-checked again;
          → failed        its entry is gone from the repository, Triton refused it, or the smoke check failed;
          (reloading)     while its server cannot be reached: the reconcile pass sends it again once it is back.

Each delivery of workbench.deployments.deploy claims the deployment (``claimed_at``) and writes it only while the
claim is its own. A redelivered task (its worker died) finds the deployment exporting or loading and starts over
from the export, which builds its entry beside the repository and renames it into place, so a half-written one is
never served. A deployment ready, failed or unloaded is left as it is. An undeploy takes the claim away: a deploy still
going stops at its next step and unloads what it loaded.
"""
import json
import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from deploy.client import GenerateParams, TritonClient, TritonError, TritonUnavailable
from webapp.finite import finite
from webapp.models import Deployment
from webapp.services.deployments import deployment_access_problem
from workers.deploy_commands import REFUSED, CommandStopped, run_deploy_command

log = logging.getLogger(__name__)
Status = Deployment.Status

EXPORT_TIMEOUT_S = 3600.0
LOAD_TIMEOUT_S = 600.0
SMOKE_TIMEOUT_S = 300.0
PROGRESS_EVERY_S = 2.0   # how often the status message tells how long the export has run
READY_POLL_S = 0.5
SETTLED = (Status.READY, Status.FAILED, Status.UNLOADED)
IN_FLIGHT = (Status.PENDING, Status.EXPORTING, Status.LOADING)


class Superseded(Exception):
    """A later delivery of the task, or an undeploy, took the deployment over."""


class DeployFailed(Exception):
    def __init__(self, message: str, smoke_ok: bool | None = None, unreachable: bool = False):
        super().__init__(message)
        self.message, self.smoke_ok, self.unreachable = message, smoke_ok, unreachable


def _client(deployment: Deployment, timeout_s: float = SMOKE_TIMEOUT_S) -> TritonClient:
    server = deployment.server
    return TritonClient(server.http_url, server.grpc_url, server.metrics_url, timeout_s)


@contextmanager
def _unreachable_fails(deployment: Deployment):
    try:
        yield
    except TritonUnavailable as exc:
        server = deployment.server
        raise DeployFailed(f"the Triton server {server.name!r} cannot be reached at {server.http_url} "
                           f"({exc.message}): start it, or have staff correct its URLs, then deploy again",
                           unreachable=True) from None


def _write(deployment: Deployment, since, **fields) -> None:
    """Update the deployment while the claim ``since`` is still its claim; Superseded otherwise."""
    if not Deployment.objects.filter(pk=deployment.pk, claimed_at=since).update(updated_at=timezone.now(),
                                                                                 **fields):
        raise Superseded()


def _claim(deployment_id: int):
    with transaction.atomic():
        deployment = (Deployment.objects.select_for_update(of=("self",))
                      .select_related("server", "checkpoint", "owner").filter(pk=deployment_id).first())
        if deployment is None or deployment.status in SETTLED:
            return None, None
        since = timezone.now()
        if deployment.status == Status.RELOADING:  # loaded again from the entry it has: nothing else changes
            if deployment.claimed_at is None:  # undeployed since the reconcile pass sent it
                return None, None
            deployment.claimed_at = since
            deployment.status_message = (f"reloading {deployment.model_name} on {deployment.server.name} from its "
                                         f"entry {deployment.repository_path}")
            deployment.save(update_fields=["claimed_at", "status_message", "updated_at"])
            return deployment, since
        deployment.status, deployment.claimed_at, deployment.smoke_ok = Status.EXPORTING, since, None
        deployment.report, deployment.ready_at, deployment.repository_path = {}, None, ""
        deployment.status_message = _exporting(deployment, 0)
        deployment.save()
        return deployment, since


def _exporting(deployment: Deployment, seconds: float) -> str:
    return (f"exporting checkpoint {deployment.checkpoint_id} ({deployment.reduction}, tensor parallel "
            f"{deployment.tensor_parallel}) into {deployment.server.model_repository}: {seconds:.0f} s so far")


def export_command(deployment: Deployment) -> list[str]:
    command = [sys.executable, "-m", "deploy", "export", "--checkpoint", deployment.checkpoint.path,
               "--repository", deployment.server.model_repository, "--name", deployment.model_name,
               "--reduction", deployment.reduction, "--tensor-parallel", str(deployment.tensor_parallel),
               "--instances", str(deployment.instances), "--kind", deployment.server.instance_kind,
               "--engine", deployment.engine]
    return command if deployment.streaming else [*command, "--no-stream"]


def _export(deployment: Deployment, since) -> dict:
    """The exporter's report; DeployFailed with its refusal (exit 2), its crash, or its time out."""
    def progress(elapsed: float, _said: str) -> bool:
        _write(deployment, since, status_message=_exporting(deployment, elapsed))
        return True

    try:
        ended = run_deploy_command(export_command(deployment), EXPORT_TIMEOUT_S, PROGRESS_EVERY_S, progress)
    except CommandStopped:
        raise DeployFailed(f"the export ran over {EXPORT_TIMEOUT_S:.0f} s and was stopped: deploy a smaller "
                           f"reduction or model, or on a faster machine") from None
    if ended.status == REFUSED:
        raise DeployFailed(f"the export was refused: {ended.last_error}")
    if ended.status != 0:
        raise DeployFailed(f"the export failed (exit status {ended.status}); its last words:\n{ended.stderr_tail}")
    try:
        report = finite(json.loads(ended.report_line))  # a perplexity may be infinite; jsonb holds no infinity
        smoke = report["smoke"]
        smoke = {**smoke, "prompt": str(smoke["prompt"]), "max_tokens": int(smoke["max_tokens"]),
                 "token_ids": [int(t) for t in smoke["token_ids"]]}
    except (ValueError, KeyError, TypeError) as exc:  # the smoke check needs these; nothing else is read
        raise DeployFailed(f"the exporter's report could not be read ({type(exc).__name__}: {exc}): "
                           f"{ended.report_line[:500]!r}") from None
    return {**report, "smoke": smoke}


def _load(client: TritonClient, deployment: Deployment) -> None:
    name = deployment.model_name
    with _unreachable_fails(deployment):
        try:
            client.load(name)
        except TritonUnavailable:
            raise
        except TritonError as exc:
            raise DeployFailed(f"Triton could not load the exported model: {exc.message}; the server's log says "
                               f"more") from None
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not client.model_ready(name):
            if time.monotonic() > deadline:
                raise DeployFailed(f"{name!r} was still not ready {LOAD_TIMEOUT_S:.0f} s after Triton loaded it: "
                                   f"see the Triton server's log")
            time.sleep(READY_POLL_S)


def _smoke(client: TritonClient, deployment: Deployment, report: dict) -> None:
    smoke = report["smoke"]
    expected = smoke["token_ids"]
    params = GenerateParams(prompt=smoke["prompt"], max_tokens=smoke["max_tokens"], temperature=0.0)
    with _unreachable_fails(deployment):
        try:
            served = client.generate(deployment.model_name, params).token_ids
        except TritonUnavailable:
            raise
        except TritonError as exc:
            raise DeployFailed(f"the smoke check's generation failed: {exc.message}", smoke_ok=False) from None
    if served != expected:
        _unload_quietly(client, deployment.model_name)
        raise DeployFailed(f"smoke check failed: for the prompt {params.prompt!r} the served model's greedy tokens "
                           f"are {served}, the checkpoint's own are {expected}; the served weights or serving code "
                           f"differ from the trainer's: deploy with reduction none, and compare the two lists",
                           smoke_ok=False)


def _unload_quietly(client: TritonClient, name: str) -> None:
    try:
        client.unload(name)
    except TritonError as exc:
        log.warning("could not unload %s: %s", name, exc.message)


def _name_held_by_another(deployment: Deployment) -> bool:
    return (Deployment.objects.filter(server_id=deployment.server_id, model_name=deployment.model_name,
                                      status__in=Deployment.HOLDING).exclude(pk=deployment.pk).exists())


def _unload_if_abandoned(deployment: Deployment) -> None:
    """After an undeploy took the claim away mid-deploy: unload what this delivery loaded, unless the name is
    another deployment's now or another delivery claimed this one."""
    current = Deployment.objects.filter(pk=deployment.pk).values_list("claimed_at", flat=True).first()
    if current is None and not _name_held_by_another(deployment):
        with _client(deployment) as client:
            _unload_quietly(client, deployment.model_name)


def _entry_problem(deployment: Deployment) -> str:
    """Why the deployment's entry cannot be loaded again, or ''."""
    entry = deployment.repository_path
    if not entry or not (Path(entry) / "config.pbtxt").is_file():
        return (f"its entry {entry or '(none recorded)'} is no longer in the model repository of "
                f"{deployment.server.name}, so it cannot be loaded again: deploy the checkpoint again")
    if not deployment.report.get("smoke"):
        return "its exporter's report has no smoke check to check it with again: deploy the checkpoint again"
    return ""


def deployment_deploy(deployment_id: int) -> str:
    """pending (or a redelivery's exporting or loading) → ready or failed; reloading → ready or failed (or still
    reloading while its server cannot be reached); any other status: nothing."""
    deployment, since = _claim(deployment_id)
    if deployment is None:
        return "skipped"
    reloading = deployment.status == Status.RELOADING
    loading = False
    try:
        if reloading:
            problem = _entry_problem(deployment)
            if problem:
                raise DeployFailed(problem)
            report = deployment.report
        else:
            problem = deployment_access_problem(deployment)
            if problem:
                raise DeployFailed(problem)
            report = _export(deployment, since)
            _write(deployment, since, status=Status.LOADING, report=report, repository_path=report.get("path", ""),
                   status_message=f"loading {deployment.model_name} on {deployment.server.name}")
        with _client(deployment) as client:
            loading = True
            _load(client, deployment)
            _write(deployment, since, status_message=f"smoke check: {report['smoke']['max_tokens']} greedy tokens")
            _smoke(client, deployment, report)
        again = " again, reloaded from its entry after its server had lost it" if reloading else ""
        _write(deployment, since, status=Status.READY, smoke_ok=True, ready_at=timezone.now(),
               status_message=f"serving as {deployment.model_name} on {deployment.server.name}{again}; its greedy "
                              f"tokens are the checkpoint's own")
        return Status.READY
    except Superseded:
        if loading:
            _unload_if_abandoned(deployment)
        return "superseded"
    except Exception as exc:  # noqa: BLE001 - whatever stops a deploy is told on the deployment, not only the log
        if isinstance(exc, DeployFailed):
            message, smoke_ok = exc.message, exc.smoke_ok
            if reloading and exc.unreachable:  # still wanted: loaded once the server is back
                server = deployment.server
                try:
                    _write(deployment, since, status_message=f"reloading: the Triton server {server.name!r} cannot "
                                                             f"be reached at {server.http_url}; it is loaded again "
                                                             f"once the server is back")
                except Superseded:
                    return "superseded"
                return "waiting"
        else:
            log.exception("deploying deployment %s failed", deployment_id)
            message, smoke_ok = f"the deploy failed unexpectedly ({type(exc).__name__}: {exc}); the worker's log " \
                                f"has the traceback", None
        try:
            _write(deployment, since, status=Status.FAILED, status_message=message, smoke_ok=smoke_ok)
        except Superseded:
            return "superseded"
        return Status.FAILED


def deployment_undeploy(deployment_id: int) -> str:
    """Unload the model and mark the deployment unloaded. When Triton cannot be reached a ready deployment stays
    ready, a message saying so; one that was still being deployed fails (its deploy has been stopped)."""
    with transaction.atomic():
        deployment = (Deployment.objects.select_for_update(of=("self",)).select_related("server")
                      .filter(pk=deployment_id).first())
        if deployment is None or deployment.status == Status.UNLOADED:
            return "skipped"
        was = deployment.status
        # a deploy still going stops at its next step
        Deployment.objects.filter(pk=deployment.pk).update(claimed_at=None, updated_at=timezone.now())
        held = _name_held_by_another(deployment)
    server = deployment.server
    if held:
        done = f"undeployed; the name {deployment.model_name!r} is another deployment's now, so nothing was unloaded"
    else:
        try:
            with _client(deployment, timeout_s=LOAD_TIMEOUT_S) as client:
                client.unload(deployment.model_name)
        except TritonError as exc:
            unreachable = isinstance(exc, TritonUnavailable)
            why = (f"the Triton server {server.name!r} cannot be reached at {server.http_url}" if unreachable
                   else f"Triton refused to unload it ({exc.message})")
            fields = {"status_message": f"could not unload {deployment.model_name!r}: {why}; undeploy again once "
                                        f"the server is back"}
            if was in IN_FLIGHT:
                fields["status"] = Status.FAILED
                fields["status_message"] = f"undeployed while being deployed, but {why}; its deploy was stopped"
            Deployment.objects.filter(pk=deployment.pk).update(updated_at=timezone.now(), **fields)
            return "unreachable" if unreachable else "refused"
        done = f"unloaded from {server.name}"
    Deployment.objects.filter(pk=deployment.pk).update(status=Status.UNLOADED, unloaded_at=timezone.now(),
                                                       status_message=done, updated_at=timezone.now())
    return Status.UNLOADED
