"""What every Triton model of this project shares, whichever engine answers: reading a request's inputs, the
responses (text_output and token_ids in each; finish_reason, prompt_tokens and completion_tokens in the last;
logprobs and prompt_logprobs where the request asked for them) and the ``workbench_*`` metric families on Triton's
metrics endpoint. Clients and dashboards then cannot tell the engines apart. Only Triton's
``triton_python_backend_utils`` and numpy: the vLLM entry carries this file too.

Log-probabilities travel as JSON text, one list per response, an entry per token:
``{"id", "token", "logprob", "top": [{"id", "token", "logprob"}, …]}`` (``token``: the token's text alone); the
prompt's first token has logprob and top null, nothing coming before it to score it."""
from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
BATCH_BUCKETS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64]
SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
RATE_BUCKETS = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500]


def read_input(request, name: str, default):
    """An optional input's value (the list of strings for ``stop``), or ``default`` when the request has none."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    return values.tolist() if name == "stop" else (values[0] if values.size else default)


def as_text(value) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def logprob_entry(token_id: int, logprob: float, top, text) -> dict:
    """One token's entry: ``top`` holds (id, logprob) pairs, ``text(id)`` gives a token's text."""
    return {"id": token_id, "token": text(token_id), "logprob": logprob,
            "top": [{"id": i, "token": text(i), "logprob": lp} for i, lp in top]}


def unscored_entry(token_id: int, text) -> dict:
    """The prompt's first token's entry."""
    return {"id": token_id, "token": text(token_id), "logprob": None, "top": None}


def _as_json(name: str, value) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.array([json.dumps(value).encode()], dtype=object))


def response(text: str, token_ids: list[int], final: tuple[str, int, int] | None = None,
             logprobs: list[dict] | None = None, prompt_logprobs: list[dict | None] | None = None):
    """One response: new text and token ids (and their log-probabilities where asked); the last one also ``final``
    = (finish reason, prompt tokens, completion tokens) and the prompt's log-probabilities where asked."""
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=object)),
               pb_utils.Tensor("token_ids", np.array(token_ids, dtype=np.int32))]
    if logprobs is not None:
        tensors.append(_as_json("logprobs", logprobs))
    if prompt_logprobs is not None:
        tensors.append(_as_json("prompt_logprobs", prompt_logprobs))
    if final is not None:
        reason, prompt_tokens, completion_tokens = final
        tensors += [pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=object)),
                    pb_utils.Tensor("prompt_tokens", np.array([prompt_tokens], dtype=np.int32)),
                    pb_utils.Tensor("completion_tokens", np.array([completion_tokens], dtype=np.int32))]
    return pb_utils.InferenceResponse(output_tensors=tensors)


def metric_family(name: str, description: str, kind):
    return pb_utils.MetricFamily(name=name, description=description, kind=kind)


class TritonMetrics:
    """The figures every engine reports, labelled by model and version."""

    def __init__(self, labels: dict[str, str]):
        H, G, C = pb_utils.MetricFamily.HISTOGRAM, pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        # The families must outlive their metrics: both are kept on self.
        self.families = [
            metric_family("workbench_time_to_first_token_seconds", "From a request's arrival to its first token", H),
            metric_family("workbench_decode_batch_size", "Sequences served by each decode step", H),
            metric_family("workbench_tokens_per_second", "Decode rate of each finished request, tokens per second",
                          H),
            metric_family("workbench_generated_tokens_total", "Tokens generated", C),
            metric_family("workbench_active_sequences", "Sequences in the engine's slots", G),
            metric_family("workbench_requests_total", "Requests answered, by finish reason", C)]
        ttft, batch, rate, tokens, active, self.requests = self.families
        self.labels = labels
        self.by_reason: dict[str, object] = {}
        self.ttft = ttft.Metric(labels=labels, buckets=SECONDS_BUCKETS)
        self.batch = batch.Metric(labels=labels, buckets=BATCH_BUCKETS)
        self.rate = rate.Metric(labels=labels, buckets=RATE_BUCKETS)
        self.tokens = tokens.Metric(labels=labels)
        self.sequences = active.Metric(labels=labels)

    def close(self) -> None:
        """Deletes every metric, then the families, in the model's ``finalize``: Triton wants a family deleted after
        its metrics, and each deletion is a message to the server. Left to the interpreter's own teardown, the order
        is arbitrary and the server may be unreachable by then (a crashed stub, an aborted server)."""
        families = self.families
        vars(self).clear()  # the metrics go; the families are still held here
        families.clear()

    def finished(self, completion_tokens: int, decode_seconds: float, reason: str) -> None:
        if reason not in self.by_reason:
            self.by_reason[reason] = self.requests.Metric(labels={**self.labels, "finish_reason": reason})
        self.by_reason[reason].increment(1)
        self.tokens.increment(completion_tokens)
        if completion_tokens > 1 and decode_seconds > 0:
            self.rate.observe((completion_tokens - 1) / decode_seconds)
