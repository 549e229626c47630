"""Every error a client can cause is a 4xx with a message that says what to change; never a 500."""
from contextlib import contextmanager

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
from .parsers import body_limit, too_large_message
from .specfields import api_field


class ClientInputError(APIException):
    """A computation on the client's numbers failed because of those numbers (400)."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "input_out_of_range"


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
