"""Server-sent events: a streamed text/event-stream answer, each event one JSON line.

An event is ``event: <name>`` (left out for unnamed ones, as the OpenAI-compatible stream has them) and ``data:
<JSON>``, then a blank line. JSON escapes line breaks, so the data of an event is always a single line.
"""
import json
from typing import Iterable

from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer

MEDIA_TYPE = "text/event-stream"


def event(data, name: str = "") -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()


def event_stream(events: Iterable[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type=MEDIA_TYPE)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front (nginx) sends each event as it comes
    return response


class EventStreamRenderer(BaseRenderer):
    """Lets a request that accepts only text/event-stream reach a streaming view; an error answered before the
    stream starts is written as one ``error`` event (its status code is the error's)."""

    media_type = MEDIA_TYPE
    format = "event-stream"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return event(data, "error")
