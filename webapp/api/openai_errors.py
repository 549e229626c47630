"""Every error of the OpenAI-compatible endpoints in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}``, which OpenAI's clients read (and raise as their typed errors: AuthenticationError for a 401,
NotFoundError for a 404, BadRequestError for a 400, InternalServerError for a 5xx)."""
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from rest_framework import exceptions, status

from ..services.triton import ServingError
from .parsers import body_limit, too_large_message


class ModelNotFound(exceptions.NotFound):
    default_code = "model_not_found"


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _first_problem(detail, path: str = "") -> tuple[str, str]:
    """The first (field path, message) of a DRF validation error's detail."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int):  # a list's item (DRF keys a list serializer's errors by index)
                where = f"{path}[{key}]"
            elif key in ("non_field_errors", "detail"):
                where = path
            else:
                where = f"{path}.{key}" if path else str(key)
            return _first_problem(value, where)
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            if value in ({}, [], ""):
                continue
            nested = isinstance(value, (dict, list))
            return _first_problem(value, f"{path}[{index}]" if nested else path)
    return path, str(detail)


def exception_handler(exc, context):
    """The answer to ``exc`` raised by an OpenAI-compatible view, or None for a bug (a 500)."""
    if isinstance(exc, ServingError):
        kind = "server_error" if exc.status >= 500 else "invalid_request_error"
        return JsonResponse(error_body(exc.message, kind, param=getattr(exc, "param", None), code=exc.code),
                            status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        return JsonResponse(error_body(too_large_message(body_limit())),
                            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, exceptions.ValidationError):
        param, message = _first_problem(exc.detail)
        return JsonResponse(error_body(f"{param}: {message}" if param else message, param=param or None),
                            status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        response = JsonResponse(error_body(
            "Incorrect API key provided, or none: send your API token as `Authorization: Bearer <token>` (POST "
            "/api/token/ gives it)", code="invalid_api_key"), status=status.HTTP_401_UNAUTHORIZED)
        response["WWW-Authenticate"] = 'Bearer realm="api"'
        return response
    if isinstance(exc, ModelNotFound):
        return JsonResponse(error_body(str(exc.detail), param="model", code="model_not_found"),
                            status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, exceptions.APIException):
        return JsonResponse(error_body(str(exc.detail), code=exc.default_code), status=exc.status_code)
    return None
