"""The Triton Python-backend model of an entry served by vLLM (written into the repository as ``1/model.py``).

The same inputs and outputs as the workbench engine's model (``deploy.serving.triton_model``), so clients do not
know which engine answers. Inputs (all but text_input optional): text_input, max_tokens, temperature, top_k, top_p,
seed (−1: none), stop (strings), stream, logprobs and prompt_logprobs (−1: none; k ≥ 0: with the k most likely
tokens beside each; vLLM's raw log-probabilities, as the workbench engine's), presence_penalty and
frequency_penalty, guide (structured output by vLLM's own backends: ``{"json_schema": {…}}`` or
``{"json_object": true}``). Outputs: text_output (the new text) and
token_ids in every response, with logprobs where asked; finish_reason ("stop", "length" or "cancelled"),
prompt_tokens and completion_tokens in the last, with prompt_logprobs where asked (the shapes: ``triton_io``).

``initialize`` starts vLLM's AsyncLLM on the Hugging Face folder ``1/hf`` with the engine arguments the export wrote
in serving.json, on an asyncio loop of its own thread. ``execute`` hands each request to that loop and returns; the
request's coroutine answers through its response sender: one response per step's new tokens for a streamed request
(decoupled models), one final response otherwise. A client that goes away is noticed at its next tokens and its
request aborted in vLLM. The prompt is tokenized here with the checkpoint's own tokenizer.json (as the workbench
engine does), so both engines see the same ids; vLLM detokenizes what it generates.

This file stands alone: vLLM, numpy and tokenizers, in the Python the backend stub runs.
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import json
import locale
import multiprocessing
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))

from triton_io import (FINAL, TritonMetrics, as_text, logprob_entry, read_input,  # noqa: E402
                       response, unscored_entry)  # (copied beside this file)

HF_FOLDER, SERVING = "hf", "serving.json"
# vLLM's finish reasons → the workbench engine's ("abort": the request was cancelled)
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


def _python_executable() -> str:
    """The interpreter vLLM's processes start with: inside Triton's stub sys.executable is not always Python."""
    return os.environ.get("WORKBENCH_SERVING_PYTHON") or shutil.which("python3") or sys.executable


def _prepare_process_start() -> None:
    """vLLM starts its engine core (and workers) as processes; in the stub's embedded Python they must be spawned
    (a fork would copy the stub's threads and shared memory) with a real interpreter, and spawn reads sys.argv."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if not getattr(sys, "argv", None):
        sys.argv = ["triton_vllm_model"]
    multiprocessing.set_executable(_python_executable())
    # Under the C locale (a server started without LANG) Python opens text files as ASCII, and torch reads its
    # UTF-8 templates as vLLM imports it: UTF-8 here, and in the processes vLLM starts.
    os.environ.setdefault("PYTHONUTF8", "1")
    if locale.getpreferredencoding(False).lower().replace("-", "") != "utf8":
        locale.setlocale(locale.LC_CTYPE, "C.UTF-8")


def _scheduler_logger(metrics: TritonMetrics):
    """A vLLM stat logger factory: each engine step's running sequences → the decode batch size and the active
    sequences. (vLLM's SchedulerStats is not a stable interface; a field it lacks is skipped.)"""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SchedulerFigures(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            running = getattr(scheduler_stats, "num_running_reqs", None)
            if running is None:
                return
            metrics.sequences.set(running)
            if running:
                metrics.batch.observe(running)

        def log_engine_initialized(self):
            pass

    return SchedulerFigures




def _structured_outputs(guide: str):
    """vLLM's structured-output parameters of a guide (ValueError where it is not one)."""
    from vllm.sampling_params import StructuredOutputsParams

    spec = json.loads(guide)
    if isinstance(spec, dict) and isinstance(spec.get("json_schema"), dict) and len(spec) == 1:
        return StructuredOutputsParams(json=spec["json_schema"])
    if spec == {"json_object": True}:
        return StructuredOutputsParams(json_object=True)
    raise ValueError('give a guide as {"json_schema": {…}} or {"json_object": true}')


def _error(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    def initialize(self, args):
        _prepare_process_start()
        from tokenizers import Tokenizer
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        config = json.loads(args["model_config"])
        folder = Path(args["model_repository"]) / args["model_version"]
        serving = json.loads((folder / SERVING).read_text())
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.max_model_len = int(serving["seq_len"])
        self.tokenizer = Tokenizer.from_file(str(folder / HF_FOLDER / "tokenizer.json"))
        self.metrics = TritonMetrics({"model": args["model_name"], "version": args["model_version"]})
        self.ids = itertools.count()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-requests", daemon=True)
        self.thread.start()
        # structured output by llguidance, as the workbench engine's, JSON written compactly: vLLM takes both per
        # engine, not per request
        engine_args = AsyncEngineArgs(model=str(folder / HF_FOLDER), **serving["vllm"],
                                      structured_outputs_config=StructuredOutputsConfig(
                                          backend="guidance", disable_any_whitespace=True))

        async def start():  # made on the loop that will drive it
            return AsyncLLM.from_engine_args(engine_args, stat_loggers=[_scheduler_logger(self.metrics)])

        started = time.perf_counter()
        self.engine = asyncio.run_coroutine_threadsafe(start(), self.loop).result()
        pb_utils.Logger.log_info(f"vLLM engine of {args['model_name']} started in "
                                 f"{time.perf_counter() - started:.1f} s")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self._parse(request)
            except (ValueError, TypeError, OverflowError) as exc:
                sender.send(_error(f"bad request: {exc}"), flags=FINAL)
                continue
            asyncio.run_coroutine_threadsafe(self._answer(sender, *job), self.loop)
        return None

    def _parse(self, request):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        stream = bool(read_input(request, "stream", False))
        if stream and not self.decoupled:
            raise ValueError("streaming needs the model exported as decoupled; ask without stream")
        prompt = self.tokenizer.encode(as_text(read_input(request, "text_input", b""))).ids
        if not prompt:
            raise ValueError("the prompt is empty: vLLM needs at least one token to continue")
        # The model's window holds prompt and answer: a longer prompt keeps its end, the answer stops at the window.
        prompt = prompt[-(self.max_model_len - 1):]
        max_tokens = int(read_input(request, "max_tokens", 64))
        if max_tokens < 1:
            raise ValueError(f"max_tokens {max_tokens}: ask for at least 1")
        seed = int(read_input(request, "seed", -1))
        top_k = int(read_input(request, "top_k", 0))
        logprobs, prompt_logprobs = (int(read_input(request, name, -1)) for name in ("logprobs", "prompt_logprobs"))
        guide = as_text(read_input(request, "guide", b""))
        params = SamplingParams(
            structured_outputs=_structured_outputs(guide) if guide else None,
            temperature=float(read_input(request, "temperature", 0.0)), top_k=max(top_k, 0),
            top_p=float(read_input(request, "top_p", 1.0)), seed=seed if seed >= 0 else None,
            max_tokens=min(max_tokens, self.max_model_len - len(prompt)),
            stop=[s for s in (as_text(v) for v in read_input(request, "stop", [])) if s] or None,
            presence_penalty=float(read_input(request, "presence_penalty", 0.0)),
            frequency_penalty=float(read_input(request, "frequency_penalty", 0.0)),
            logprobs=logprobs if logprobs >= 0 else None,
            prompt_logprobs=prompt_logprobs if prompt_logprobs >= 0 else None,
            skip_special_tokens=False, spaces_between_special_tokens=False,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
        return prompt, params

    async def _answer(self, sender, prompt: list[int], params) -> None:
        """One request through vLLM, answered on ``sender``; never raises (a failure is the request's error)."""
        request_id = f"r{next(self.ids)}"
        arrived = time.perf_counter()
        first_token_at = None
        completion, reason = 0, "cancelled"
        prompt_scores = None  # vLLM gives the prompt's log-probabilities once, with the first output
        try:
            async for output in self.engine.generate({"prompt_token_ids": prompt}, params, request_id):
                if sender.is_cancelled():  # the client went away: vLLM stops the sequence
                    await self.engine.abort(request_id)
                    break
                delta = output.outputs[0]
                ids = list(delta.token_ids)
                if ids and first_token_at is None:
                    first_token_at = time.perf_counter()
                    self.metrics.ttft.observe(first_token_at - arrived)
                completion += len(ids)
                if prompt_scores is None and output.prompt_logprobs is not None:
                    prompt_scores = self._entries(prompt, output.prompt_logprobs, params.prompt_logprobs)
                logprobs = self._entries(ids, delta.logprobs, params.logprobs)
                if output.finished:
                    reason = FINISH_REASONS.get(delta.finish_reason or "stop", str(delta.finish_reason))
                    sender.send(response(delta.text, ids, (reason, len(prompt), completion), logprobs,
                                         prompt_scores), flags=FINAL)
                    break
                if ids or delta.text:
                    sender.send(response(delta.text, ids, logprobs=logprobs))
            else:
                reason = "cancelled"  # the stream ended without a finished output: vLLM aborted it
            if reason == "cancelled":
                sender.send(response("", [], (reason, len(prompt), completion)), flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - one request's failure is told to its client, not the others'
            pb_utils.Logger.log_warn(f"request {request_id} failed: {type(exc).__name__}: {exc}")
            try:
                sender.send(_error(f"vLLM could not answer: {type(exc).__name__}: {exc}"), flags=FINAL)
            except Exception:  # noqa: BLE001 - the client is gone
                pass
            return
        decode_seconds = time.perf_counter() - first_token_at if first_token_at is not None else 0.0
        self.metrics.finished(completion, decode_seconds, reason)

    def _entries(self, ids: list[int], scores, top: int | None) -> list[dict | None] | None:
        """vLLM's log-probabilities of ``ids`` (for each, a dict of token id → Logprob holding the token and the
        ``top`` most likely, ranked from 1; None where nothing scores it: a prompt's first token) as entries."""
        if scores is None or top is None:
            return None
        text = lambda token_id: self.tokenizer.decode([token_id], skip_special_tokens=False)  # noqa: E731
        entries = []
        for token_id, candidates in zip(ids, scores):
            if candidates is None:
                entries.append(unscored_entry(token_id, text))
                continue
            best = sorted((c.rank, i, c.logprob) for i, c in candidates.items() if c.rank <= top)
            entries.append(logprob_entry(token_id, candidates[token_id].logprob,
                                         [(i, logprob) for _, i, logprob in best], text))
        return entries

    def finalize(self):
        """Triton calls this once the model's requests are answered. Everything is torn down here, while the stub's
        interpreter and its link to the server still work: vLLM's engine process, the engine object (its ``__del__``
        would otherwise run in the interpreter's own teardown, and fail), the loop, then the metrics. Left to that
        teardown, the stub crashed on unload and took the server with it."""
        async def stop_reading():  # vLLM stops its engine process first, and the task reading it would log that as
            handler = getattr(self.engine, "output_handler", None)  # an error: that task is cancelled before
            if handler is not None:
                handler.cancel()
                await asyncio.wait([handler])

        try:
            asyncio.run_coroutine_threadsafe(stop_reading(), self.loop).result(timeout=30)
            self.engine.shutdown()
        finally:
            self.engine = None
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            if not self.thread.is_alive():
                self.loop.close()
            gc.collect()  # vLLM's objects, and any cycle holding a metric, go now rather than at teardown
            self.metrics.close()
