"""The Triton Python-backend model of an exported GPT (written into the repository as ``1/model.py``).

``initialize`` reads the config and the version folder once: the weights (this instance's tensor-parallel ranks
started as processes when the model is split), the tokenizer, and the engine's thread. ``execute`` only hands each
request to the engine and returns: the engine answers through the request's response sender, one response per
token for a streamed request (decoupled models), one final response otherwise.

The engine's settings are the config's parameters: tensor_parallel, max_sequences (slots, 16), prefill_chunk_tokens
(prompt tokens computed in one iteration, 512), prefix_cache_tokens (positions the prefix cache holds, in blocks of
16; 0 turns it off; 4 × seq_len by default) and cpu_threads (each rank's compute threads on a CPU; by default the
cores less one, shared by the instances' ranks).

Inputs (all but text_input optional): text_input, max_tokens, temperature, top_k, top_p, seed (−1: none), stop
(strings), stream, logprobs and prompt_logprobs (−1: none; k ≥ 0: each token's log-probability with the k most
likely beside it), presence_penalty and frequency_penalty (OpenAI's), guide (structured output: ``guide``). Outputs: text_output (the new text) and token_ids in every response, with logprobs where asked;
finish_reason, prompt_tokens and completion_tokens in the last, with prompt_logprobs where asked
(``triton_io``).
"""
from __future__ import annotations

import json
import queue
import sys
import threading
from pathlib import Path

import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from workbench_serving.engine import Engine  # noqa: E402
from workbench_serving.guide import GuideError, Guides  # noqa: E402
from workbench_serving.layout import MODEL_SPEC, SERVING, TOKENIZER, Codec, read_json  # noqa: E402
from workbench_serving.prefix_cache import PREFIX_BLOCK_SIZE  # noqa: E402
from workbench_serving.request import Request, Result, Sampling, TokenLogprob  # noqa: E402
from workbench_serving.scheduler import PREFILL_CHUNK  # noqa: E402
from workbench_serving.tensor_parallel import build_rank_model, cpu_threads, device_for, start_leader  # noqa: E402
from workbench_serving.triton_io import (BATCH_BUCKETS, FINAL, TritonMetrics, as_text,  # noqa: E402
                                         logprob_entry, metric_family, read_input, response, unscored_entry)


class EngineMetrics(TritonMetrics):
    """Every engine's figures, and what only this engine has: its prefill batches and its prefix cache."""

    def __init__(self, labels: dict[str, str]):
        super().__init__(labels)
        H, C = pb_utils.MetricFamily.HISTOGRAM, pb_utils.MetricFamily.COUNTER
        own = [metric_family("workbench_prefill_batch_size", "Prompts (or chunks of prompts) computed by each prefill",
                             H),
               metric_family("workbench_prefix_cache_lookups_total", "Prompts looked up in the prefix cache", C),
               metric_family("workbench_prefix_cache_hits_total", "Prompts that found a prefix in the prefix cache", C),
               metric_family("workbench_prefix_cache_hit_tokens_total", "Prompt tokens taken from the prefix cache", C)]
        self.families += own
        prefill, lookups, hits, hit_tokens = own
        self.prefill = prefill.Metric(labels=labels, buckets=BATCH_BUCKETS)
        self.lookups, self.hits = lookups.Metric(labels=labels), hits.Metric(labels=labels)
        self.hit_tokens = hit_tokens.Metric(labels=labels)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def decode_step(self, batch_size: int) -> None:
        self.batch.observe(batch_size)

    def prefill_step(self, sequences: int, tokens: int) -> None:
        self.prefill.observe(sequences)

    def prefix_lookup(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.lookups.increment(1)
        if cached_tokens:
            self.hits.increment(1)
            self.hit_tokens.increment(cached_tokens)

    def active(self, sequences: int) -> None:
        self.sequences.set(sequences)


class Outbox:
    """Responses leave from their own thread, in order: the engine goes on with its next decode step while the
    last step's tokens are made into responses and handed to Triton (the costlier part for a small model)."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._send_all, name="responses", daemon=True)
        self._thread.start()

    def send(self, sender, make, flags: int = 0) -> None:
        self._queue.put((sender, make, flags))

    def _send_all(self) -> None:
        while (item := self._queue.get()) is not None:
            sender, make, flags = item
            try:
                sender.send(make(), flags=flags)
            except Exception as exc:  # noqa: BLE001 - a client gone mid-answer must not stop the others'
                pb_utils.Logger.log_warn(f"a response could not be sent: {exc}")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)


class ResponseSink:
    """One request's response sender, as the engine's Sink; ``token_text(id)`` names a token in log-probabilities."""

    def __init__(self, sender, outbox: Outbox, token_text, first_prompt_id: int):
        self.sender, self.outbox, self.streamed, self.token_text = sender, outbox, False, token_text
        self.first_prompt_id = first_prompt_id

    def _entries(self, logprobs: list[TokenLogprob] | None) -> list[dict] | None:
        if logprobs is None:
            return None
        return [logprob_entry(p.token_id, p.logprob, p.top, self.token_text) for p in logprobs]

    def on_token(self, text: str, token_id: int, logprob: TokenLogprob | None = None) -> None:
        self.streamed = True
        logprobs = None if logprob is None else [logprob]
        self.outbox.send(self.sender, lambda: response(text, [token_id], logprobs=self._entries(logprobs)))

    def on_finish(self, result: Result) -> None:
        text = result.unsent if self.streamed else result.text
        ids = [] if self.streamed else result.token_ids
        logprobs = None if self.streamed else result.logprobs
        prompt = None if result.prompt_logprobs is None else \
            [unscored_entry(self.first_prompt_id, self.token_text), *self._entries(result.prompt_logprobs)]
        final = (result.finish_reason, result.prompt_tokens, result.completion_tokens)
        self.outbox.send(self.sender, lambda: response(text, ids, final, self._entries(logprobs), prompt), FINAL)

    def on_error(self, message: str) -> None:
        self.outbox.send(self.sender, lambda: pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                         FINAL)

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = Path(args["model_repository"]) / args["model_version"]
        serving = read_json(folder / SERVING)
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        world = int(params.get("tensor_parallel", serving.get("tensor_parallel", 1)))
        slots = int(params.get("max_sequences", 16))
        seq_len = int(serving["seq_len"])
        prefix_blocks = int(params.get("prefix_cache_tokens", 4 * seq_len)) // PREFIX_BLOCK_SIZE
        kind = "gpu" if args.get("model_instance_kind") == "GPU" else "cpu"
        base = int(args.get("model_instance_device_id") or 0)
        dtype = getattr(torch, serving.get("compute_dtype_" + kind, "float32"))
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        threads = int(params.get("cpu_threads", 0)) or cpu_threads(instances * world)
        self.leader = None
        if world > 1:
            self.leader = start_leader(folder, world, slots, kind, base, dtype, prefix_blocks, threads)
            runner = self.leader
        else:
            runner = build_rank_model(folder, 0, 1, slots, device_for(kind, base, 0), dtype, prefix_blocks, threads)
        self.codec = Codec(folder / TOKENIZER)
        self.guides = Guides(folder / TOKENIZER, int(read_json(folder / MODEL_SPEC)["vocab_size"]), self.codec.eos_id)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.metrics = EngineMetrics(labels)
        self.outbox = Outbox()
        self.engine = Engine(runner, self.codec, seq_len, self.metrics, device_for(kind, base, 0),
                             int(params.get("prefill_chunk_tokens", PREFILL_CHUNK)))
        self.engine.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                stream = bool(read_input(request, "stream", False))
                if stream and not self.decoupled:
                    raise ValueError("streaming needs the model exported as decoupled; ask without stream")
                seed = int(read_input(request, "seed", -1))
                prompt = self.codec.encode(as_text(read_input(request, "text_input", b"")))
                guide = as_text(read_input(request, "guide", b""))
                guided = self.guides.start(guide) if guide else None
                sink = ResponseSink(sender, self.outbox, self._token_text, prompt[0] if prompt else 0)
                self.engine.submit(Request(
                    prompt_ids=prompt, sink=sink,
                    max_tokens=int(read_input(request, "max_tokens", 64)),
                    sampling=Sampling(float(read_input(request, "temperature", 0.0)),
                                      int(read_input(request, "top_k", 0)), float(read_input(request, "top_p", 1.0)),
                                      seed if seed >= 0 else None, int(read_input(request, "logprobs", -1)),
                                      int(read_input(request, "prompt_logprobs", -1)),
                                      float(read_input(request, "presence_penalty", 0.0)),
                                      float(read_input(request, "frequency_penalty", 0.0))),
                    stop=tuple(as_text(s) for s in read_input(request, "stop", []) if s), stream=stream,
                    guided=guided))
            except (ValueError, TypeError, OverflowError) as exc:  # GuideError among them
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"bad request: {exc}")),
                            flags=FINAL)
        return None

    def _token_text(self, token_id: int) -> str:
        return self.codec.decode([token_id])

    def finalize(self):
        self.engine.stop()
        self.outbox.close()
        if self.leader is not None:
            self.leader.close()
        self.metrics.close()
