"""Every error a client can cause is a 4xx with a message that says what to change; never a 500."""
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.db.models import ProtectedError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from trainer.contract import SpecError

from ..spec_errors import spec_field_errors
from .specfields import api_field


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(detail, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, SpecError):
        return Response(spec_field_errors(exc, api_field), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ProtectedError):
        users = sorted({f"{o._meta.verbose_name} {o.pk}" for o in exc.protected_objects})[:10]
        return Response({"detail": "still in use by " + ", ".join(users) + "; delete or change those first"},
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, IntegrityError):
        return Response({"detail": f"conflicts with an existing object: {exc}"}, status=status.HTTP_409_CONFLICT)
    return drf_exception_handler(exc, context)
