"""The error answers in the OpenAPI schema: every operation lists the 4xx it can give, each with its body.

Errors have two shapes (webapp.api.errors): a field-by-field ``ValidationError`` for 400 (each field's messages,
nested for a spec's fields, ``non_field_errors`` for the whole object) and ``{"detail": …}`` for the rest.
Operations that ask a Triton server also declare 502 and 503, given the ``Error`` body here. Every integer and string
of the schema also carries the bounds the whole API enforces (the 64-bit range, no NUL).
"""
from .parsers import MAX_INT

ERROR = {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}},
         "description": "What went wrong and what to change"}
VALIDATION_ERROR = {
    "type": "object", "description": "Messages by field: a list of messages, or an object of a spec's fields (a "
                                     "dotted path's parts) to their messages; `non_field_errors` for the whole "
                                     "object, `detail` for a body that could not be read",
    "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "array", "items": {}}, {"type": "object"}]}}

_ANSWERS = {
    "400": ("the request is not valid: the body names each field's problem", "ValidationError"),
    "401": ("no credentials, or credentials that are not valid", "Error"),
    "403": ("signed in, but not allowed to do this (or a session request without its CSRF token)", "Error"),
    "404": ("no such object that you can see (or no such page of a list)", "Error"),
    "409": ("conflicts with the stored objects: another one of the name, or objects that still use it", "Error"),
    "413": ("the request body is over the size limit", "Error"),
    "415": ("the body is not of a media type this operation reads", "Error"),
    "429": ("too many requests of this kind (sign-in attempts); wait as Retry-After says", "Error"),
}
# Answered only by the operations that declare them (those that ask a model server): their bodies are added here.
_DECLARED = ("502", "503")
_WRITES = {"post", "put", "patch", "delete"}
# An operation that may stream its answer (webapp.api.sse) writes an error as one event when asked for a stream
_STREAM = "text/event-stream"
_ERROR_EVENT = {"schema": {"type": "object", "required": ["event", "data"], "properties": {
    "event": {"type": "string", "enum": ["error"]},
    "data": {"type": "string", "description": "the error's body (an `Error`) as JSON"}}}}
# The integers a JSON body may hold (webapp.api.parsers refuses others): every integer in the schema says so
INT_RANGE = {"minimum": -MAX_INT, "maximum": MAX_INT}
# No string may hold a NUL (DRF's and Django's fields refuse it, and so does the contract): every string says so
NO_NUL = "^[^\\x00]*$"


def _codes(path: str, method: str, operation: dict) -> list[str]:
    codes = ["400", "401", "403", "404"]
    if method in _WRITES:
        codes.append("409")
    if "requestBody" in operation:
        codes += ["413", "415"]
    if path == "/api/token/":
        codes.append("429")
    return codes


def document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: add the error components and each operation's error answers."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR)
    schemas.setdefault("ValidationError", VALIDATION_ERROR)
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in _WRITES | {"get", "head", "options"}:
                continue
            responses = operation.setdefault("responses", {})
            for code in _codes(path, method, operation):
                description, component = _ANSWERS[code]
                responses.setdefault(code, {"description": description, "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{component}"}}}})
            for code in _DECLARED:
                if code in responses:
                    responses[code].setdefault("content", {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}})
            if _STREAM in responses.get("200", {}).get("content", {}):
                for code, response in responses.items():
                    if code != "200" and "content" in response:
                        response["content"].setdefault(_STREAM, _ERROR_EVENT)
    _bound_scalars(result)
    return result


def _bound_scalars(node) -> None:
    """What every integer and string of the API is bounded by, written on each one that says nothing narrower."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and "enum" not in node:
            for key, bound in INT_RANGE.items():
                node.setdefault(key, bound)
        if node.get("type") == "string" and not {"enum", "format", "pattern"} & set(node):
            node["pattern"] = NO_NUL
        for value in node.values():
            _bound_scalars(value)
    elif isinstance(node, list):
        for value in node:
            _bound_scalars(value)
