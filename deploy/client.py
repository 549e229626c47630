"""Talking to a Triton server, local or remote, by URL: readiness, model control, statistics, generation, streaming.

No torch here: the web app imports this module (and nothing else of ``deploy``). Generation speaks to the models
``deploy.export`` writes (inputs text_input, max_tokens, …; outputs text_output, token_ids, …):
- gRPC (tritonclient.grpc): always through a stream, which serves decoupled and non-decoupled models alike; closing
  a stream early cancels its request on the server, so the model stops that sequence.
- HTTP: tritonclient.http's infer for a non-decoupled model; Triton refuses infer on a decoupled (streaming) one,
  which is answered through Triton's generate extension instead (``/generate``, and ``/generate_stream`` as
  server-sent events), over the standard library's HTTP client.
Every failure becomes one of three errors, each with a message a person can act on: the server cannot be reached,
the model is not loaded, or the model refused the request.
"""
from __future__ import annotations

import http.client
import json
import queue
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


# The models' interface, counted up as inputs are added (deploy.export writes it into each entry's report; a report
# without it is of interface 1), and the interface each later input came with.
INTERFACE = 2
ADDED_IN = {"logprobs": 2, "prompt_logprobs": 2, "presence_penalty": 2, "frequency_penalty": 2, "guide": 2}


class TritonError(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class TritonUnavailable(TritonError):
    """The server cannot be reached."""


class ModelNotReady(TritonError):
    """The model is not loaded, or not ready."""


class RequestRejected(TritonError):
    """The model refused the request; the message says why."""


@dataclass(frozen=True)
class GenerateParams:
    prompt: str
    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    logprobs: Optional[int] = None         # k: each generated token's log-probability with the k most likely
    prompt_logprobs: Optional[int] = None  # k: the same for the prompt's tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    guide: Optional[str] = None  # structured output: '{"json_schema": {…}}' or '{"json_object": true}'

    @property
    def optional_inputs(self) -> dict[str, tuple[Any, Any]]:
        """The inputs added to the models' interface later (ADDED_IN) where asked: name → (value, numpy dtype)."""
        inputs = {"logprobs": (self.logprobs, np.int32), "prompt_logprobs": (self.prompt_logprobs, np.int32),
                  "presence_penalty": (self.presence_penalty or None, np.float32),
                  "frequency_penalty": (self.frequency_penalty or None, np.float32),
                  "guide": (self.guide, np.object_)}
        return {name: (value, dtype) for name, (value, dtype) in inputs.items() if value is not None}

    def inputs(self, stream: bool) -> dict[str, tuple[list, Any]]:
        """Input name → (values, numpy dtype) of the exported model's inputs."""
        values: dict[str, tuple[list, Any]] = {
            "text_input": ([self.prompt.encode()], np.object_), "max_tokens": ([self.max_tokens], np.int32),
            "temperature": ([self.temperature], np.float32), "top_k": ([self.top_k], np.int32),
            "top_p": ([self.top_p], np.float32), "stream": ([stream], np.bool_)}
        if self.seed is not None:
            values["seed"] = ([self.seed], np.int64)
        if self.stop:
            values["stop"] = ([s.encode() for s in self.stop], np.object_)
        for name, (value, dtype) in self.optional_inputs.items():
            values[name] = ([value.encode() if isinstance(value, str) else value], dtype)
        return values

    def json(self, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"text_input": self.prompt, "max_tokens": self.max_tokens,
                                "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                                "stream": stream}
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        return {**body, **{name: value for name, (value, _) in self.optional_inputs.items()}}


@dataclass(frozen=True)
class Chunk:
    """One response: the new text and tokens. finish_reason is "" and prompt_tokens 0 until the last;
    completion_tokens counts the tokens so far. Log-probabilities, where asked, are the models' entries
    ({"id", "token", "logprob", "top": [{"id", "token", "logprob"}]}; the prompt's first token has logprob and top
    None): of this response's tokens, and of the prompt in the last."""

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: Optional[list[dict]] = None
    prompt_logprobs: Optional[list[dict]] = None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "cancelled"
    logprobs: Optional[list[dict]] = None
    prompt_logprobs: Optional[list[dict]] = None


def _completion(chunks: list[Chunk]) -> Completion:
    last = chunks[-1]
    scored = [c.logprobs for c in chunks if c.logprobs is not None]
    return Completion("".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids], last.prompt_tokens,
                      last.completion_tokens, last.finish_reason, [p for ps in scored for p in ps] if scored else None,
                      last.prompt_logprobs)


def _first(value) -> Any:
    while isinstance(value, (list, tuple, np.ndarray)) and len(value) == 1:
        value = value[0]
    return value


def _text(value) -> str:
    value = _first(value)
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _chunk(get, counted: int = 0) -> Chunk:
    """A Chunk from ``get(name)`` → an output's values (None when the response has no such output: a streamed
    token carries its text and id only, so its completion count is the tokens counted so far, ``counted``)."""
    ids = _ids(get("token_ids"))
    reason, prompt, completion = get("finish_reason"), get("prompt_tokens"), get("completion_tokens")
    return Chunk(_text(get("text_output")), ids, _text(reason) if reason is not None else "",
                 int(_first(prompt)) if prompt is not None else 0,
                 int(_first(completion)) if completion is not None else counted + len(ids),
                 _json(get("logprobs")), _json(get("prompt_logprobs")))


def _json(value) -> Any:
    """An output the models send as JSON text (log-probabilities), or None where the response has none."""
    return None if value is None else json.loads(_text(value))


def _infer_inputs(make, params: GenerateParams, stream: bool) -> list:
    """The request's tensors as tritonclient's InferInput of one protocol (``make``)."""
    tensors = []
    for name, (values, dtype) in params.inputs(stream).items():
        array = np.array(values, dtype=dtype)
        tensor = make(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


_NOT_READY = ("not found", "unknown model", "no available versions", "is not ready", "not ready",
              "failed to load", "unavailable model")


def _classify(message: str, where: str) -> TritonError:
    lowered = message.lower()
    if any(s in lowered for s in ("connection refused", "failed to connect", "unavailable: ", "statuscode.unavailable",
                                  "name or service not known", "timed out", "connection reset")):
        return TritonUnavailable(f"Triton at {where} cannot be reached: {message}")
    if any(s in lowered for s in _NOT_READY):
        return ModelNotReady(f"the model is not loaded on Triton at {where}: {message}")
    return RequestRejected(message)


class TritonClient:
    def __init__(self, http_url: str, grpc_url: str = "", metrics_url: str = "", timeout_s: float = 30.0):
        parts = urlsplit(http_url if "://" in http_url else f"http://{http_url}")
        self.http_url = f"{parts.scheme}://{parts.netloc}"
        self.grpc_url = grpc_url.removeprefix("grpc://")
        self.metrics_url = metrics_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = httpclient.InferenceServerClient(parts.netloc, ssl=parts.scheme == "https",
                                                      connection_timeout=timeout_s, network_timeout=timeout_s)
        self._decoupled: dict[str, bool] = {}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "TritonClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the server ----------------------------------------------------------------------------------------------
    def _call(self, method, *args, **kwargs):
        try:
            return method(*args, **kwargs)
        except InferenceServerException as exc:
            raise _classify(str(exc.message() or exc), self.http_url) from None
        except (OSError, ConnectionError) as exc:
            raise TritonUnavailable(f"Triton at {self.http_url} cannot be reached: {exc}") from None

    def server_ready(self) -> bool:
        try:
            return bool(self._http.is_server_ready())
        except Exception:  # noqa: BLE001 - unreachable, refused, half-started: all "not ready"
            return False

    def server_metadata(self) -> dict:
        return self._call(self._http.get_server_metadata)

    def repository_index(self) -> list[dict]:
        return self._call(self._http.get_model_repository_index)

    def load(self, model: str) -> None:
        self._decoupled.pop(model, None)
        try:
            self._http.load_model(model)
        except InferenceServerException as exc:
            raise TritonError(f"Triton at {self.http_url} could not load {model!r}: {exc.message() or exc}") from None
        except (OSError, ConnectionError) as exc:
            raise TritonUnavailable(f"Triton at {self.http_url} cannot be reached: {exc}") from None

    def unload(self, model: str) -> None:
        self._decoupled.pop(model, None)
        self._call(self._http.unload_model, model)

    def model_ready(self, model: str) -> bool:
        try:
            return bool(self._http.is_model_ready(model))
        except InferenceServerException:
            return False
        except (OSError, ConnectionError) as exc:
            raise TritonUnavailable(f"Triton at {self.http_url} cannot be reached: {exc}") from None

    def model_config(self, model: str) -> dict:
        return self._call(self._http.get_model_config, model)

    def statistics(self, model: str = "") -> dict:
        return self._call(self._http.get_inference_statistics, model)

    def metrics(self) -> str:
        if not self.metrics_url:
            raise TritonError("no metrics URL is configured for this server")
        try:
            with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=self.timeout_s) as answer:
                return answer.read().decode()
        except OSError as exc:
            raise TritonUnavailable(f"Triton's metrics at {self.metrics_url} cannot be reached: {exc}") from None

    def decoupled(self, model: str) -> bool:
        if model not in self._decoupled:
            if not self.model_ready(model):
                raise ModelNotReady(f"{model!r} is not loaded on Triton at {self.http_url}")
            policy = self.model_config(model).get("model_transaction_policy", {})
            self._decoupled[model] = bool(policy.get("decoupled", False))
        return self._decoupled[model]

    # -- generation ----------------------------------------------------------------------------------------------
    def generate(self, model: str, params: GenerateParams, protocol: str = "http") -> Completion:
        if protocol == "grpc":
            return _completion(list(self._grpc_stream(model, params, stream=False)))
        if protocol != "http":
            raise ValueError(f"protocol {protocol!r}: choose http or grpc")
        if self.decoupled(model):
            return _completion([self._post_generate(model, params)])
        return _completion([self._http_infer(model, params)])

    def stream(self, model: str, params: GenerateParams, protocol: str = "grpc") -> Iterator[Chunk]:
        """The answer token by token; leaving the loop early (closing the iterator) cancels the request."""
        if protocol == "grpc":
            return self._grpc_stream(model, params, stream=True)
        if protocol != "http":
            raise ValueError(f"protocol {protocol!r}: choose http or grpc")
        return self._http_stream(model, params)

    def _http_infer(self, model: str, params: GenerateParams) -> Chunk:
        result = self._call(self._http.infer, model, _infer_inputs(httpclient.InferInput, params, stream=False))
        return _chunk(result.as_numpy)

    def _request(self, model: str, path: str, body: dict) -> http.client.HTTPResponse:
        url = f"{self.http_url}/v2/models/{model}/{path}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            raise _classify(str(detail), self.http_url) from None
        except OSError as exc:
            raise TritonUnavailable(f"Triton at {self.http_url} cannot be reached: {exc}") from None

    def _post_generate(self, model: str, params: GenerateParams) -> Chunk:
        with self._request(model, "generate", params.json(stream=False)) as answer:
            data = json.loads(answer.read())
        return _chunk(data.get)

    def _http_stream(self, model: str, params: GenerateParams) -> Iterator[Chunk]:
        """Triton's generate_stream events. Only the last response's finish reason marks the end, so a stream that
        ends without one was cut off (the server stopped or the connection broke)."""
        answer = self._request(model, "generate_stream", params.json(stream=True))
        counted = 0
        try:
            for raw in answer:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = json.loads(line[5:])
                if "error" in data:
                    raise _classify(str(data["error"]), self.http_url)
                chunk = _chunk(data.get, counted)
                counted = chunk.completion_tokens
                yield chunk
                if chunk.finish_reason:
                    return
        except (http.client.HTTPException, OSError) as exc:
            raise TritonUnavailable(f"Triton at {self.http_url} broke off the stream: {exc}") from None
        finally:
            answer.close()  # leaving early drops the connection: Triton cancels the request
        raise TritonUnavailable(f"Triton at {self.http_url} ended the stream before its last response, after "
                                f"{counted} tokens: the server stopped or the connection broke")

    def _grpc_error(self, client, error) -> TritonError:
        """A stream's error, classified; a broken stream's message hides why it broke, so ask the server."""
        found = _classify(str(error.message() if hasattr(error, "message") else error), self.grpc_url)
        if isinstance(found, RequestRejected):
            try:
                live = client.is_server_live()
            except InferenceServerException:
                live = False
            if not live:
                return TritonUnavailable(f"Triton at {self.grpc_url} cannot be reached: {found.message}")
        return found

    def _grpc_stream(self, model: str, params: GenerateParams, stream: bool) -> Iterator[Chunk]:
        if not self.grpc_url:
            raise TritonError("no gRPC URL is configured for this server")
        client = grpcclient.InferenceServerClient(self.grpc_url)
        answers: queue.Queue = queue.Queue()
        inputs = _infer_inputs(grpcclient.InferInput, params, stream)
        finished, counted = False, 0
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)),
                                stream_timeout=None)
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
            while True:
                try:
                    result, error = answers.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise TritonUnavailable(f"Triton at {self.grpc_url} sent nothing for {self.timeout_s:.0f} s") \
                        from None
                if error is not None:
                    raise self._grpc_error(client, error)
                response = result.get_response()
                final = response.parameters.get("triton_final_response")
                if response.outputs:
                    chunk = _chunk(result.as_numpy, counted)
                    counted = chunk.completion_tokens
                    if chunk.text or chunk.token_ids or chunk.finish_reason:
                        yield chunk
                    if chunk.finish_reason:
                        finished = True
                        return
                if final is not None and final.bool_param:
                    finished = True
                    return
        except InferenceServerException as exc:
            raise self._grpc_error(client, exc) from None
        finally:
            try:
                client.stop_stream(cancel_requests=not finished)
            finally:
                client.close()
