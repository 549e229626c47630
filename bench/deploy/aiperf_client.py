"""NVIDIA's AIPerf, the standard LLM benchmark client, driven from here: installed in a virtual environment of its
own, run once per target and concurrency, its JSON export read back.

Why its own environment: aiperf brings about 150 packages (dash, kubernetes, optuna, textual, its own pytest and
rich pins) that are no part of this project, and the vLLM engine shares the project's environment with pins of its
own; a client that talks HTTP needs none of the server's packages, so it lives apart (in the user's cache folder,
``~/.cache/llm-workbench/aiperf-<version>``, made on first use with pip) and neither side can break the other.
guidellm was the other candidate: its releases that install beside numpy<2 and torch 2.13.0's CPU build are a year
old (0.2), the current one pulls numpy 2 and a CUDA torch.

What is measured (aiperf's definitions): time to first token and inter-token latency per request, averaged; output
tokens per second over the whole run. aiperf counts output tokens by tokenizing the text it received with the
model's tokenizer (the Hugging Face folder), so a model whose text re-tokenizes to what it generated (any briefly
trained one; not random weights, whose stray bytes come back as several tokens each) is counted right.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

AIPERF_VERSION = "0.13.0"
# A cache folder outside the checkout, so that every clone of the project on a machine (CI's too) shares one install
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llm-workbench" / \
    f"aiperf-{AIPERF_VERSION}"
# aiperf's export, in every artifact folder
EXPORT_JSON = "profile_export_aiperf.json"
RECORDS_JSONL = "profile_export.jsonl"


class ClientError(RuntimeError):
    """The client could not be installed or a run failed; the message says which and where its log is."""


@dataclass(frozen=True)
class Target:
    """Where aiperf sends requests and in which format. ``endpoint_type`` "completions" is OpenAI's /v1/completions;
    "template" renders ``payload`` (a Jinja template of the JSON body) for a server of another format, reading each
    streamed event's ``response_field``."""
    label: str
    url: str
    model: str
    endpoint_type: str
    endpoint: str = ""
    api_key: str = ""
    payload: str = ""
    response_field: str = ""


@dataclass(frozen=True)
class Measurement:
    streams: int
    requests: int
    errors: int
    ttft_ms: float           # mean time to first token
    itl_ms: float            # mean inter-token latency
    tokens_per_s: float      # output tokens per second, all streams together
    tokens_per_request: float
    decoding: float = 0.0    # streams decoding at once, as a token sees them (0: no records to tell)


def triton_generate_target(label: str, http_url: str, model: str, temperature: float) -> Target:
    """Triton's HTTP generate extension, streamed (``/v2/models/<model>/generate_stream``): the JSON body's keys are
    the model's input names."""
    payload = ('{"text_input": {{ text|tojson }}, "max_tokens": {{ max_tokens }}, "stream": true, '
               f'"temperature": {temperature}}}')
    return Target(label, http_url, model, "template", f"/v2/models/{model}/generate_stream",
                  payload=payload, response_field="text_output")


def openai_completions_target(label: str, base_url: str, model: str, api_key: str) -> Target:
    return Target(label, base_url, model, "completions", api_key=api_key)


def aiperf_executable(venv_dir: Path = DEFAULT_VENV) -> Path:
    """aiperf in ``venv_dir``, installed there first if it is missing (a few minutes, once)."""
    venv_dir = Path(venv_dir)
    executable = venv_dir / "bin" / "aiperf"
    if executable.is_file():
        return executable
    print(f"installing aiperf {AIPERF_VERSION} in {venv_dir} (once; a few minutes)", file=sys.stderr, flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
    done = subprocess.run([str(venv_dir / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           f"aiperf=={AIPERF_VERSION}"], capture_output=True, text=True)
    if done.returncode != 0 or not executable.is_file():
        raise ClientError(f"pip could not install aiperf=={AIPERF_VERSION} in {venv_dir}:\n{done.stderr[-2000:]}")
    return executable


def command(executable: Path, target: Target, streams: int, requests: int, new_tokens: int, tokenizer: Path,
            prompts: Path, artifacts: Path, temperature: float) -> list[str]:
    """One aiperf run: ``requests`` requests, ``streams`` of them in flight at a time, after a warm-up of one
    request per stream; prompts from a JSONL file, each asking ``new_tokens`` tokens."""
    args = [str(executable), "profile", "--model", target.model, "--tokenizer", str(tokenizer), "--url", target.url,
            "--endpoint-type", target.endpoint_type, "--streaming",
            "--input-file", str(prompts), "--custom-dataset-type", "single_turn",
            "--output-tokens-mean", str(new_tokens), "--output-tokens-stddev", "0",
            "--concurrency", str(streams), "--request-count", str(requests), "--warmup-request-count", str(streams),
            "--random-seed", "0", "--artifact-dir", str(artifacts),
            # quiet and light: no dashboard, no telemetry scraping, one worker and one record processor so the
            # client takes as little as it can of the cores the server uses
            "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry", "--workers-max", "1",
            "--record-processors", "1"]
    if target.endpoint:
        args += ["--endpoint", target.endpoint]
    if target.api_key:
        args += ["--api-key", target.api_key]
    if target.endpoint_type == "template":
        template = artifacts.parent / f"{artifacts.name}-payload.json"
        template.write_text(target.payload)  # a file: aiperf splits inline extra inputs at commas
        args += ["--extra-inputs", f"payload_template:{template}", "--extra-inputs",
                 f"response_field:{target.response_field}"]
    else:
        args += ["--extra-inputs", f"temperature:{temperature}"]
    return args


def decoding_streams(records: Path) -> float:
    """How many streams were decoding at once while a stream decoded, over the measured requests of aiperf's
    per-request records (each decodes from its first token to its end): a server slower to take requests than the
    client to send them decodes fewer at once than the concurrency asked. 0 without records."""
    records = Path(records)
    spans = []
    for line in filter(None, records.read_text().splitlines() if records.is_file() else []):
        record = json.loads(line)
        meta, first = record.get("metadata", {}), record.get("metrics", {}).get("time_to_first_token")
        if meta.get("benchmark_phase") == "profiling" and first and "request_end_ns" in meta:
            spans.append((meta["request_start_ns"] + first["value"] * 1e6, meta["request_end_ns"]))
    events = sorted([(begin, 1) for begin, _ in spans] + [(end, -1) for _, end in spans])
    weighted = decoding_time = 0.0
    now, running = None, 0
    for at, change in events:  # between events, ``running`` streams decode, each of them for that long
        if now is not None:
            weighted += running * running * (at - now)
            decoding_time += running * (at - now)
        now, running = at, running + change
    return weighted / decoding_time if decoding_time else 0.0


def read_export(path: Path, streams: int) -> Measurement:
    """The figures of aiperf's JSON export ``path``, and of the per-request records beside it."""
    data = json.loads(Path(path).read_text())

    def avg(key: str) -> float:
        value = data.get(key) or {}
        return float(value.get("avg") or 0.0)

    errors = data.get("error_summary") or []
    return Measurement(streams=streams, requests=int(avg("request_count")),
                       errors=sum(int(e.get("count", 1)) for e in errors) if isinstance(errors, list) else 0,
                       ttft_ms=avg("time_to_first_token"), itl_ms=avg("inter_token_latency"),
                       tokens_per_s=avg("output_token_throughput"),
                       tokens_per_request=avg("output_sequence_length"),
                       decoding=decoding_streams(Path(path).parent / RECORDS_JSONL))


def profile(target: Target, streams: int, requests: int, new_tokens: int, tokenizer: Path, prompts: Path,
            artifacts: Path, temperature: float = 1.0, venv_dir: Path = DEFAULT_VENV,
            timeout_s: Optional[float] = None) -> Measurement:
    """Run aiperf against ``target`` and return what it measured; its log is ``artifacts``/logs/aiperf.log."""
    artifacts = Path(artifacts)
    artifacts.parent.mkdir(parents=True, exist_ok=True)
    args = command(aiperf_executable(venv_dir), target, streams, requests, new_tokens, tokenizer, prompts, artifacts,
                   temperature)
    # aiperf must not find a project's package of its own name (or anything else) before its own
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=artifacts.parent)
    except subprocess.TimeoutExpired as exc:
        raise ClientError(f"aiperf against {target.label} at {streams} streams ran past {timeout_s} s; "
                          f"log: {artifacts / 'logs' / 'aiperf.log'}") from exc
    export = artifacts / EXPORT_JSON
    if done.returncode != 0 or not export.is_file():
        raise ClientError(f"aiperf against {target.label} at {streams} streams failed (status {done.returncode}); "
                          f"log: {artifacts / 'logs' / 'aiperf.log'}\n{(done.stdout + done.stderr)[-3000:]}")
    return read_export(export, streams)
