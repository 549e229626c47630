"""A checkpoint of any plan → one Triton model-repository entry that stands on its own.

    python -m deploy export --checkpoint runs/<id>/checkpoints/step-<n> --repository <models> --name tiny \
        [--reduction int8] [--tensor-parallel 2] [--instances 1] [--kind cpu|gpu] [--no-stream] \
        [--engine workbench|vllm]

Two steps: ``deploy.prepare`` reads the checkpoint once, reduces its weights once, measures what the reduction cost
and the checkpoint's own greedy generation for a prompt, and splits the weights into the serving layout; then
``write_entry`` writes that prepared export with what serves it: config.pbtxt, ``1/model.py`` and the
``workbench_serving`` package beside it, the tokenizer and the model spec (the files: ``deploy.serving.layout``).
The entry is built in a folder beside the repository and renamed into place (``deploy.staging``), so a server never
sees half of it. The deployment's smoke check compares what the server answers with the recorded generation. The
report is printed as one JSON line and kept in serving.json.

This module writes the ``workbench`` engine's entry; ``--engine vllm`` writes one served by vLLM from the same
prepared export (``deploy.vllm.entry``), with the same inputs, outputs and smoke reference.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from safetensors.torch import save_file

from deploy.client import INTERFACE
from deploy.prepare import ExportError, PreparedExport, PrepareOptions, prepare
from deploy.reduce import REDUCTIONS
from deploy.serving import layout
from deploy.staging import staged

SERVING_PACKAGE = Path(__file__).parent / "serving"
PACKAGE_NAME = "workbench_serving"
# Compute precision by reduction: the GPU computes in the stored half precision (int8 dequantises to fp16);
# the CPU computes in fp32 whatever is stored, which is also what the smoke check's reference does.
GPU_DTYPE = {"none": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "float16"}
# What serves an entry: this project's engine, or vLLM's (deploy.vllm).
ENGINES = ("workbench", "vllm")


@dataclass(frozen=True)
class ExportOptions:
    """What ``prepare`` is asked (reduction, tensor_parallel, measure) and how the Triton entry serves it."""

    name: str
    reduction: str = "none"
    tensor_parallel: int = 1
    instances: int = 1
    kind: str = "cpu"            # instance kind: "cpu" (KIND_CPU) or "gpu" (KIND_GPU, tensor_parallel GPUs each)
    max_sequences: int = 16      # the engine's slots: sequences decoded together at most
    streaming: bool = True       # decoupled: one response per token; otherwise one response per request
    measure: bool = True         # validation perplexity of the reduced weights against fp32
    engine: str = "workbench"    # one of ENGINES

    def preparation(self) -> PrepareOptions:
        return PrepareOptions(reduction=self.reduction, tensor_parallel=self.tensor_parallel, measure=self.measure)

    def problems(self) -> list[str]:
        found = []
        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            found.append(f"name {self.name!r}: use letters, digits, '-' and '_'")
        found += self.preparation().problems()
        if self.instances < 1 or self.max_sequences < 1:
            found.append(f"instances={self.instances} and max_sequences={self.max_sequences} must be at least 1")
        if self.kind not in ("cpu", "gpu"):
            found.append(f"kind {self.kind!r}: choose cpu or gpu")
        if self.engine not in ENGINES:
            found.append(f"engine {self.engine!r}: choose one of {', '.join(ENGINES)}")
        return found


def config_pbtxt(options: ExportOptions) -> str:
    """Triton's model configuration. max_batch_size is 0: requests are batched inside the model, step by step
    (the engine's max_sequences), not by Triton's batcher, which would hold whole requests together."""
    inputs = [("text_input", "TYPE_STRING", "[ 1 ]", False), ("max_tokens", "TYPE_INT32", "[ 1 ]", True),
              ("temperature", "TYPE_FP32", "[ 1 ]", True), ("top_k", "TYPE_INT32", "[ 1 ]", True),
              ("top_p", "TYPE_FP32", "[ 1 ]", True), ("seed", "TYPE_INT64", "[ 1 ]", True),
              ("stop", "TYPE_STRING", "[ -1 ]", True), ("stream", "TYPE_BOOL", "[ 1 ]", True),
              ("logprobs", "TYPE_INT32", "[ 1 ]", True), ("prompt_logprobs", "TYPE_INT32", "[ 1 ]", True),
              ("presence_penalty", "TYPE_FP32", "[ 1 ]", True), ("frequency_penalty", "TYPE_FP32", "[ 1 ]", True),
              ("guide", "TYPE_STRING", "[ 1 ]", True)]
    outputs = [("text_output", "TYPE_STRING", "[ 1 ]"), ("token_ids", "TYPE_INT32", "[ -1 ]"),
               ("finish_reason", "TYPE_STRING", "[ 1 ]"), ("prompt_tokens", "TYPE_INT32", "[ 1 ]"),
               ("completion_tokens", "TYPE_INT32", "[ 1 ]"), ("logprobs", "TYPE_STRING", "[ 1 ]"),
               ("prompt_logprobs", "TYPE_STRING", "[ 1 ]")]
    if options.engine == "vllm" and options.kind == "gpu":  # vLLM places its tensor-parallel ranks itself
        groups = f"  {{ kind: KIND_MODEL count: {options.instances} }}"
    elif options.kind == "gpu":  # each instance's ranks take tensor_parallel consecutive GPUs from its first
        groups = ",\n".join(f"  {{ kind: KIND_GPU count: 1 gpus: [ {i * options.tensor_parallel} ] }}"
                            for i in range(options.instances))
    else:
        groups = f"  {{ kind: KIND_CPU count: {options.instances} }}"
    lines = [f'name: "{options.name}"', 'backend: "python"', "max_batch_size: 0"]
    if options.streaming:
        lines.append("model_transaction_policy { decoupled: true }")
    lines.append("input [\n" + ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: {d}{" optional: true" if o else ""} }}' for n, t, d, o in inputs)
        + "\n]")
    lines.append("output [\n" + ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in outputs)
                 + "\n]")
    lines.append("instance_group [\n" + groups + "\n]")
    for key, value in (("tensor_parallel", options.tensor_parallel), ("max_sequences", options.max_sequences),
                       ("engine", options.engine)):
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


def _copy_serving_code(version: Path) -> None:
    """model.py, and the package it imports beside it (this project's serving code, as it is)."""
    shutil.copyfile(SERVING_PACKAGE / "triton_model.py", version / "model.py")
    package = version / PACKAGE_NAME
    package.mkdir()
    for source in SERVING_PACKAGE.glob("*.py"):
        if source.name != "triton_model.py":
            shutil.copyfile(source, package / source.name)


def serving_report(prepared: PreparedExport, options: ExportOptions, entry: Path, seconds: float) -> dict[str, Any]:
    """serving.json: what the export measured, where the entry and its checkpoint are, how it serves."""
    return {**prepared.quality,
            "name": options.name, "path": str(entry.resolve()), "checkpoint": str(prepared.checkpoint.resolve()),
            "step": prepared.manifest.step, "tensor_parallel": options.tensor_parallel,
            "instances": options.instances, "kind": options.kind, "streaming": options.streaming,
            "seq_len": prepared.spec.seq_len, "compute_dtype_cpu": "float32",
            "compute_dtype_gpu": GPU_DTYPE[options.reduction], "smoke": prepared.smoke,
            "engine": options.engine, "interface": INTERFACE, "export_seconds": round(seconds, 3)}


def write_entry(prepared: PreparedExport, repository: str | Path, options: ExportOptions) -> dict:
    """Write ``<repository>/<options.name>`` from ``prepared``; return the report (also in serving.json)."""
    problems = options.problems()
    if options.engine != "workbench":
        problems.append(f"engine {options.engine!r}: this writer writes the workbench engine's entry")
    if options.preparation() != prepared.options:
        problems.append(f"the export was prepared with {prepared.options}, the entry asks {options.preparation()}: "
                        f"prepare it again with the entry's options")
    if problems:
        raise ExportError("; ".join(problems))
    started = time.perf_counter()
    entry = Path(repository) / options.name
    with staged(entry) as staging:
        version = staging / "1"
        (version / layout.WEIGHTS).mkdir(parents=True)
        for rank, shard in enumerate(prepared.shards):
            save_file(shard, str(layout.shard_file(version, rank)))
        _copy_serving_code(version)
        shutil.copyfile(prepared.tokenizer, version / layout.TOKENIZER)
        (version / layout.MODEL_SPEC).write_text(json.dumps(prepared.spec.to_dict(), indent=2))
        report = serving_report(prepared, options, entry, prepared.seconds + time.perf_counter() - started)
        (version / layout.SERVING).write_text(json.dumps(report, indent=2))
        (staging / "config.pbtxt").write_text(config_pbtxt(options))
    return report


def export(checkpoint: str | Path, repository: str | Path, options: ExportOptions) -> dict:
    """``checkpoint`` prepared and written as ``<repository>/<options.name>``; return the report. Options that
    cannot be written are refused before the checkpoint is read."""
    problems = options.problems()
    if problems:
        raise ExportError("; ".join(problems))
    return write_entry(prepare(checkpoint, options.preparation()), repository, options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ExportOptions(name="")
    parser.add_argument("--checkpoint", required=True, help="a checkpoints/step-<n> folder (any plan, any engine)")
    parser.add_argument("--repository", required=True, help="the Triton model repository to write into")
    parser.add_argument("--name", required=True, help="the model's name in Triton")
    parser.add_argument("--reduction", default=defaults.reduction, choices=REDUCTIONS)
    parser.add_argument("--tensor-parallel", type=int, default=defaults.tensor_parallel,
                        help="ranks (processes; GPUs on a GPU server) each instance splits the model over")
    parser.add_argument("--instances", type=int, default=defaults.instances)
    parser.add_argument("--kind", default=defaults.kind, choices=("cpu", "gpu"))
    parser.add_argument("--max-sequences", type=int, default=defaults.max_sequences,
                        help="sequences an instance decodes together at most")
    parser.add_argument("--no-stream", dest="streaming", action="store_false",
                        help="one response per request (not decoupled): Triton's HTTP infer and gRPC infer work")
    parser.add_argument("--no-measure", dest="measure", action="store_false",
                        help="skip the validation perplexity of the reduced weights")
    parser.add_argument("--engine", default=defaults.engine, choices=ENGINES,
                        help="what serves the entry in Triton: this project's engine, or vLLM's (from the Hugging "
                             "Face layout; refused before export for a model vLLM cannot serve)")


Exporter = Callable[[Path, Path, ExportOptions], dict]


def run(args: argparse.Namespace, exporters: Optional[dict[str, Exporter]] = None) -> int:
    """A checkpoint → a Triton model-repository entry (reduced, split, with its serving code).

    ``exporters``: engine → the function writing its entry (``deploy.__main__`` adds vLLM's)."""
    options = ExportOptions(name=args.name, reduction=args.reduction, tensor_parallel=args.tensor_parallel,
                            instances=args.instances, kind=args.kind, max_sequences=args.max_sequences,
                            streaming=args.streaming, measure=args.measure, engine=args.engine)
    writer = (exporters or {"workbench": export}).get(options.engine)
    try:
        if writer is None:
            raise ExportError(f"engine {options.engine!r} has no exporter here")
        report = writer(args.checkpoint, args.repository, options)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0

