"""Every error a client can cause is a 4xx with a message that says what to change; never a 500. Every error under
/api/ and /v1 is JSON, whoever answers it (JSONErrorsMiddleware)."""
import json
from contextlib import contextmanager
from http import HTTPStatus

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.db.models import ProtectedError
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from trainer.contract import SpecError

from ..finite import non_finite_path
from ..services.triton import ServingError
from ..spec_errors import spec_field_errors
from .openai_errors import error_body
from .parsers import body_limit, too_large_message
from .specfields import api_field


class ClientInputError(APIException):
    """A computation on the client's numbers failed because of those numbers (400)."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "input_out_of_range"


class Conflict(APIException):
    """The request is well formed but the stored objects stand in its way (409): a name another object has, or a
    state that no longer allows the change (a finished run cancelled again). The client changes its choice, not the
    request's form."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


@contextmanager
def computing_on(what: str):
    """The last resort around code that computes on what a client sent (the planner's estimates and tunes).

    Such code is bounded by the contract's ranges and the API's checks; should a value still overflow a float, nest
    too deep or be refused by a conversion, the cause is the input, and the answer is a 400 that says so. Only
    here: the same exceptions anywhere else are the server's bugs and stay 500s.
    """
    try:
        yield
    except SpecError:
        raise
    except (OverflowError, RecursionError, ValueError) as exc:
        raise ClientInputError(f"{what} could not be computed from these numbers ({type(exc).__name__}: {exc}); "
                               f"use smaller sizes, counts and budgets") from None


def require_finite(answer, what: str):
    """``answer`` unchanged, or ClientInputError naming the figure that overflowed: JSON has no infinity."""
    where = non_finite_path(answer)
    if where:
        raise ClientInputError(f"{what} overflowed at {where} (the figure is beyond a 64-bit float): use smaller "
                               f"sizes, counts and budgets")
    return answer


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):  # Django's own check of DATA_UPLOAD_MAX_MEMORY_SIZE, as JSON
        return Response({"detail": too_large_message(body_limit())}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(detail, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, SpecError):
        return Response(spec_field_errors(exc, api_field), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ProtectedError):
        users = sorted({f"{o._meta.verbose_name} {o.pk}" for o in exc.protected_objects})[:10]
        return Response({"detail": "still in use by " + ", ".join(users) + "; delete or change those first"},
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ServingError):  # a model server's answer, or its absence: 503, 400 or 502 with why
        return Response({"detail": exc.message}, status=exc.status)
    if isinstance(exc, IntegrityError):
        return Response({"detail": f"conflicts with an existing object: {exc}"}, status=status.HTTP_409_CONFLICT)
    return drf_exception_handler(exc, context)


API_PREFIX, OPENAI_PREFIX = "/api/", "/v1"


def _openai_path(path: str) -> bool:
    return path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/")


def _message(request, response) -> str:
    """What an error answered outside the API's views says: Django's pages carry it in HTML only."""
    where = f"{request.method} {request.path}"
    status_code = response.status_code
    if status_code == 404:
        return f"no API route matches {where}: the routes and their parameters are listed at /api/docs/"
    if status_code == 405:
        return f"{where}: the method is not allowed here (allowed: {response.get('Allow', 'none')})"
    if status_code == 403:
        return (f"{where}: CSRF verification failed, or the request is not allowed. A signed-in browser form sends "
                f"its CSRF token; an API client sends `Authorization: Token <key>` (POST /api/token/) instead")
    if status_code == 400:
        return (f"{where} was refused before it reached a view: a Host header this server does not answer to, a "
                f"body over the size limit, or a malformed request")
    if status_code >= 500:
        return f"the server failed on {where}; the error is logged for the administrators"
    try:
        return f"{where}: {HTTPStatus(status_code).phrase}"
    except ValueError:  # a status code HTTP does not name
        return f"{where}: refused with status {status_code}"


class JSONErrorsMiddleware:
    """Every error under /api/ (the API's ``{"detail": …}``) and /v1 (OpenAI's ``{"error": {…}}``) answered as JSON.

    The API's views answer their own errors as JSON (exception_handler above, webapp.api.openai_errors for /v1), but
    Django answers others as HTML pages: the 404 of a path no route matches (a malformed id, /api/runs/abc/updates/),
    a plain Django view's 405, the CSRF 403, the 400 of a Host header not allowed, and any 500 — in DEBUG its
    technical pages, which handler404 and handler500 do not replace. Outermost of the middleware, this rewrites
    such an answer under the two prefixes as JSON with the same status and headers (Allow kept); Django has logged
    the error already. The browsable API's error page becomes its JSON; an error an event stream carries (an
    ``error`` event, for a client that accepts only text/event-stream) stays an event.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        path = request.path_info
        content_type = response.get("Content-Type", "")
        if (response.status_code < 400 or getattr(response, "streaming", False) or "json" in content_type
                or content_type.startswith("text/event-stream")):
            return response
        if _openai_path(path):
            kind = "server_error" if response.status_code >= 500 else "invalid_request_error"
            body = error_body(_message(request, response), kind)
        elif path.startswith(API_PREFIX):
            data = getattr(response, "data", None)  # a DRF answer rendered for a browser: its own message
            body = data if isinstance(data, (dict, list)) and data else {"detail": _message(request, response)}
        else:
            return response
        response.content = json.dumps(body, ensure_ascii=False).encode()
        response["Content-Type"] = "application/json"
        if response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
        return response
