"""Deployments' desired state against what their Triton server has loaded: the deployments are the truth.

A deployment that should be serving (ready, or already reloading) on a server that is up but has not loaded its
model (the server was restarted: with explicit model control it starts with nothing loaded) is marked reloading and
sent to a worker, which loads it again from its entry and smoke-checks it (workers.deploying). The reconcile pass
asks this of every ready server (webapp.services.triton.triton_readiness_refresh), so after a restart every
deployment that was ready is ready again without anyone acting, and meanwhile its status says it is reloading.

An undeploy takes the deployment's claim away before it unloads; a deployment without a claim is not loaded again,
and once its server is seen without its model it is unloaded, as its undeploy wanted.
"""
from datetime import datetime, timedelta

from django.utils import timezone

from ..models import Deployment, TritonServer
from .tasks import TaskName, enqueue

Status = Deployment.Status

# A reloading deployment still not loaded this long after its last word is sent to a worker again: its task was
# lost, or its server went away meanwhile.
RESEND_AFTER = timedelta(seconds=30)
# One that has said nothing for longer than a load and a smoke check may take (workers.deploying) is sent again even
# if its model is loaded: its worker died between the load and the word "ready".
STALLED_AFTER = timedelta(minutes=16)
LOADED_STATES = ("READY", "LOADING")  # Triton's model states that need no load from us


def loaded_models(index: list[dict]) -> set[str]:
    """The names a server's repository index shows loaded (or loading)."""
    return {model["name"] for model in index if model.get("state") in LOADED_STATES}


def deployments_reconcile(server: TritonServer, loaded: set[str], asked_at: datetime) -> dict[int, str]:
    """Bring ``server``'s deployments in line with ``loaded``, the models it had loaded at ``asked_at``; what was
    done, by deployment id ('reloading' or 'unloaded'). Only deployments unchanged since ``asked_at`` are judged, so
    that one which became ready while the server was being asked is not loaded twice."""
    done = {}
    serving = Deployment.objects.filter(server=server, status__in=Deployment.SERVING, updated_at__lt=asked_at)
    for deployment in serving:
        lost, quiet_for = deployment.model_name not in loaded, asked_at - deployment.updated_at
        if deployment.claimed_at is None:
            if lost and _unloaded(deployment, server):
                done[deployment.pk] = Status.UNLOADED
        elif deployment.status == Status.READY:
            if lost and _reloading(deployment, server):
                done[deployment.pk] = Status.RELOADING
        elif (lost and quiet_for > RESEND_AFTER) or quiet_for > STALLED_AFTER:
            if _reloading(deployment, server):
                done[deployment.pk] = Status.RELOADING
    return done


def _unchanged(deployment: Deployment):
    """The deployment's row, as long as nobody (a worker, an undeploy) has written it since it was read."""
    return Deployment.objects.filter(pk=deployment.pk, status=deployment.status, claimed_at=deployment.claimed_at,
                                     updated_at=deployment.updated_at)


def _reloading(deployment: Deployment, server: TritonServer) -> bool:
    message = (f"reloading: {server.name} is up but has not loaded {deployment.model_name} (it was restarted?); "
               f"a worker loads it again from its entry {deployment.repository_path} and checks it")
    if not _unchanged(deployment).update(status=Status.RELOADING, status_message=message,
                                         updated_at=timezone.now()):
        return False
    enqueue(TaskName.DEPLOYMENT_DEPLOY, deployment.pk)
    return True


def _unloaded(deployment: Deployment, server: TritonServer) -> bool:
    now = timezone.now()
    return bool(_unchanged(deployment).update(
        status=Status.UNLOADED, unloaded_at=now, updated_at=now,
        status_message=f"unloaded: it was undeployed, and {server.name} no longer has it loaded"))
