"""Request bodies bounded before any view reads them: their size, the nesting depth of JSON, and its numbers.

DATA_UPLOAD_MAX_MEMORY_SIZE bounds the body: Django refuses a longer one when DRF reads it (the exception handler
answers 413), and this parser reads no more than that many bytes from whatever stream it is given.
Python's json module recurses once per nesting level and fails with RecursionError somewhere past a thousand
levels; the depth is counted first, without recursion, and JSON deeper than WORKBENCH["MAX_JSON_DEPTH"] is refused
with 400. Numbers that no field could take are refused while parsing, so no view ever sees them: integers beyond
64 bits (the database's widest) and floats that overflow to infinity (``1e400``; JSON has no infinity, Python's
parser makes one).
"""
import json
import math
import re
from itertools import accumulate

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

MAX_INT = 2**63 - 1
# A JSON string (escapes included), or one bracket; what lies between them cannot open or close a level.
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"


def body_limit() -> int:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def too_large_message(limit: int) -> str:
    return (f"the request body is over {limit:,} bytes (DJANGO_MAX_REQUEST_BYTES): send less, or upload large data "
            f"as a file through /api/datasets/upload/")


def read_bounded(stream, limit: int) -> bytes:
    """At most ``limit`` bytes of ``stream``; RequestTooLarge if it holds more."""
    data = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise RequestTooLarge(too_large_message(limit))
    return data


def json_depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest, counted without recursion (brackets in strings ignored)."""
    steps = (1 if m[0] in "[{" else -1 for m in _STRING_OR_BRACKET.finditer(text) if m[0] in "[]{}")
    return max(accumulate(steps), default=0)


def _int(text: str) -> int:
    value = int(text)
    if abs(value) > MAX_INT:
        raise ValueError(f"the integer {text[:20]}… has {len(text.lstrip('-'))} digits; integers must lie within "
                         f"±{MAX_INT} (64 bits)")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a 64-bit float; numbers must be finite")
    return value


def _constant(name: str):
    raise ValueError(f"{name} is not JSON: numbers must be finite")


def parse_json(data: bytes, max_depth: int):
    """The JSON value of ``data``: ParseError (400) for invalid JSON, deep nesting, or numbers out of range."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"the request body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise ParseError(f"JSON nested {depth} levels deep; at most {max_depth} levels are accepted "
                         f"(WORKBENCH_MAX_JSON_DEPTH): flatten the request")
    try:
        return json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except ValueError as exc:  # json.JSONDecodeError is one; so are the number refusals above
        raise ParseError(f"JSON parse error: {exc}") from None


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, bounded: body size (413), nesting depth and numbers (400)."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = read_bounded(stream, body_limit())
        if not data.strip():
            raise ParseError("the request body is empty: send a JSON object")
        return parse_json(data, settings.WORKBENCH["MAX_JSON_DEPTH"])
