"""The answers of the OpenAI-compatible endpoints in OpenAI's shapes (webapp.api.openai): a completion's or a chat's
whole answer, or its stream of chunks, with one choice per answer asked (``n``).

A whole answer has a choice per answer, in order, with its ``finish_reason`` ("stop", "length", or "tool_calls"
where a chat's answer is a call of one of its tools: webapp.services.tools) and its log-probabilities where asked
(webapp.api.openai_logprobs); ``usage`` counts the prompt once and every answer's
tokens. A stream is server-sent ``data: {chunk}`` events, each of one choice (its ``index``): a chat's opening
chunks name the role, each new text (or a token whose text is held back, with its log-probability) is a chunk, each
answer ends with a chunk of its finish_reason; with ``stream_options.include_usage`` a last chunk of no choices
carries the usage; ``data: [DONE]`` ends it.
"""
import time
import uuid
from typing import Iterator

from deploy.client import Chunk, Completion

from ..services.tools import Tools
from ..services.triton import ServingError
from .openai_errors import error_body
from .openai_logprobs import chat_logprobs, completion_logprobs
from .sse import event


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Answer:
    """One request's answer: the whole, or chunk by chunk. ``echo``: the prompt, written before each of a
    completion's texts (with its tokens' log-probabilities before the answer's, where those were asked)."""

    def __init__(self, kind: str, model: str, include_usage: bool = False, echo: str | None = None,
                 tools: Tools | None = None):
        self.chat, self.tools = kind == "chat", tools
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created, self.model, self.include_usage, self.echo = int(time.time()), model, include_usage, echo
        self.streamed: dict[int, int] = {}  # by choice: characters of a completion's text sent (its text_offset)

    def _head(self, chunk: bool) -> dict:
        object_ = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": object_, "created": self.created, "model": self.model}

    def _logprobs(self, index: int, entries: list[dict] | None, prompt: list[dict] | None = None) -> dict | None:
        if entries is None:
            return None
        if self.chat:
            return chat_logprobs(entries)
        return completion_logprobs((prompt or []) + entries, self.streamed.get(index, 0))

    def whole(self, completions: list[Completion]) -> dict:
        choices = []
        for index, completion in enumerate(completions):
            choice = {"index": index, "finish_reason": _finish(completion.finish_reason),
                      "logprobs": self._logprobs(index, completion.logprobs, completion.prompt_logprobs)}
            calls = self.tools.calls(completion.text) if self.tools is not None else None
            if calls:
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls"
            elif self.chat:
                choice["message"] = {"role": "assistant", "content": completion.text}
            else:
                choice["text"] = (self.echo or "") + completion.text
            choices.append(choice)
        return {**self._head(chunk=False), "choices": choices,
                "usage": _usage(completions[0].prompt_tokens, sum(c.completion_tokens for c in completions))}

    def _chunk(self, index: int, text: str | None, finish: str | None, role: bool = False,
               logprobs: list[dict] | None = None) -> bytes:
        choice = {"index": index, "finish_reason": finish, "logprobs": self._logprobs(index, logprobs)}
        self.streamed[index] = self.streamed.get(index, 0) + len(text or "")
        if self.chat:
            choice["delta"] = {**({"role": "assistant"} if role else {}), **({} if text is None else
                                                                             {"content": text})}
        else:
            choice["text"] = text or ""
        body = {**self._head(chunk=True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return event(body)

    def events(self, chunks: Iterator[tuple[int, Chunk]], n: int = 1) -> Iterator[bytes]:
        """The stream of ``chunks`` (each with its answer's index, of ``n``)."""
        last: dict[int, Chunk] = {}
        try:
            if self.chat:
                for index in range(n):
                    yield self._chunk(index, "", None, role=True)
            for index, chunk in chunks:
                last[index] = chunk
                if chunk.text or chunk.logprobs:  # a token whose text is held back still has its logprob
                    yield self._chunk(index, chunk.text, None, logprobs=chunk.logprobs)
                if chunk.finish_reason:
                    yield self._chunk(index, None if self.chat else "", _finish(chunk.finish_reason))
            for index in range(n):  # an answer whose stream ended without its last response
                if index not in last or not last[index].finish_reason:
                    yield self._chunk(index, None if self.chat else "", _finish(""))
            if self.include_usage and last:
                usage = _usage(next(iter(last.values())).prompt_tokens, sum(c.completion_tokens for c in last.values()))
                yield event({**self._head(chunk=True), "choices": [], "usage": usage})
            yield event("[DONE]")
        except ServingError as exc:
            kind = "server_error" if exc.status >= 500 else "invalid_request_error"
            yield event(error_body(exc.message, kind, code=exc.code))
        finally:
            chunks.close()  # a client gone mid-stream: the requests are cancelled on the server
