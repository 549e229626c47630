"""Talking to a Triton server through deploy.client, and its failures as the web app answers them.

deploy.client raises TritonUnavailable (the server cannot be reached), ModelNotReady (the model is not loaded),
RequestRejected (the model refused the input) and TritonError (anything else). Here they become ServingError, whose
``status`` the views answer with its message: 503 when the model cannot answer now (a client may try again later),
400 when the request was refused, 502 when Triton failed otherwise. None of them is a bug of the web app, so none
is a 500: the client library speaks to another process over the network, and whatever it raises is that process's
answer, or its absence.
"""
import logging
from contextlib import contextmanager

from django.utils import timezone

from deploy.client import ModelNotReady, RequestRejected, TritonClient, TritonError, TritonUnavailable

from ..models import TritonServer
from .serving_state import deployments_reconcile, loaded_models

log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 5.0       # a status page answers quickly, even when the server hangs
READY_TIMEOUT_S = 2.0        # asked on every reconcile pass: a server that hangs holds the pass up for no longer
GENERATE_TIMEOUT_S = 300.0   # the longest wait for a token: a long prompt on a CPU server


class ServingError(Exception):
    """Triton could not serve the request; ``message`` says what to change or wait for."""

    status = 502
    code = "model_server_error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ServingUnavailable(ServingError):
    """The server cannot be reached, the model is not loaded, or the deployment is not ready (yet)."""

    status = 503
    code = "model_unavailable"


class ServingRejected(ServingError):
    """The model refused the request's input."""

    status = 400
    code = "request_rejected"


def client_for(server: TritonServer, timeout_s: float = GENERATE_TIMEOUT_S) -> TritonClient:
    with triton_errors(server):
        return TritonClient(server.http_url, server.grpc_url, server.metrics_url, timeout_s)


@contextmanager
def triton_errors(server: TritonServer, model: str = ""):
    """deploy.client's errors (and whatever else the client raises) as ServingError."""
    try:
        yield
    except TritonUnavailable as exc:
        raise ServingUnavailable(f"the Triton server {server.name!r} cannot be reached ({exc.message}): start it, "
                                 f"or ask staff to correct its URLs") from None
    except ModelNotReady as exc:
        raise ServingUnavailable(f"model {model!r} is not loaded on the Triton server {server.name!r} "
                                 f"({exc.message}): if its server was restarted, the workbench is loading it again "
                                 f"from its entry; try again shortly, and see the deployment's status") from None
    except RequestRejected as exc:
        raise ServingRejected(f"the model refused the request: {exc.message}") from None
    except TritonError as exc:
        raise ServingError(f"the Triton server {server.name!r} failed: {exc.message}") from None
    except Exception as exc:  # noqa: BLE001 - the network client's own failure: the server's answer, not our bug
        log.exception("Triton client failed against %s", server.http_url)
        raise ServingError(f"talking to the Triton server {server.name!r} failed ({type(exc).__name__}: {exc}); "
                           f"check the server and its URLs") from None


def triton_server_status(server: TritonServer) -> dict:
    """Readiness, metadata and the model repository's index of ``server``; ServingUnavailable if it cannot be
    reached. The answer is also recorded on the server (``is_ready``, ``last_seen_at``)."""
    try:
        with client_for(server, STATUS_TIMEOUT_S) as client, triton_errors(server):
            metadata = client.server_metadata()
            models = client.repository_index()
            ready = client.server_ready()
    except ServingError:
        TritonServer.objects.filter(pk=server.pk).update(is_ready=False)
        raise
    TritonServer.objects.filter(pk=server.pk).update(is_ready=ready, last_seen_at=timezone.now())
    return {"ready": ready, "metadata": metadata, "models": models}


def triton_readiness_refresh() -> dict[str, bool]:
    """Ask every Triton server whether it is ready and record the answers, by server name. The reconcile pass calls
    it, so that the deploy form and the admin show what is true now, not what the last status request saw. Of a
    ready server the models it has loaded are read too, and every deployment that should be serving there but is
    not loaded is sent to be loaded again (webapp.services.serving_state)."""
    answers = {}
    for server in TritonServer.objects.all():
        asked_at, loaded = timezone.now(), None
        try:
            with client_for(server, READY_TIMEOUT_S) as client:
                ready = client.server_ready()  # unreachable, refused or still starting: False
            if ready:  # the index waits while a model loads or unloads: a little longer
                with client_for(server, STATUS_TIMEOUT_S) as client:
                    loaded = loaded_models(client.repository_index())
        except ServingError:  # URLs the client cannot even use
            ready = False
        except TritonError as exc:  # ready, but its index could not be read: its deployments are judged next time
            log.warning("could not read the model index of Triton server %s: %s", server.name, exc.message)
        seen = {"last_seen_at": timezone.now()} if ready else {}
        TritonServer.objects.filter(pk=server.pk).update(is_ready=ready, **seen)
        answers[server.name] = ready
        if loaded is not None:
            deployments_reconcile(server, loaded, asked_at)
    return answers
