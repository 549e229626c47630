"""A checkpoint of any plan → one Triton model-repository entry that stands on its own.

    python -m deploy export --checkpoint runs/<id>/checkpoints/step-<n> --repository <models> --name tiny \
        [--reduction int8] [--tensor-parallel 2] [--instances 1] [--kind cpu|gpu] [--no-stream]

The checkpoint's weights are read whole (any engine, any plan: trainer.checkpoint.consolidated), reduced
(deploy.reduce), split into the serving layout (deploy.reshard), and written with what serves them: config.pbtxt,
``1/model.py`` and the ``workbench_serving`` package beside it, the tokenizer and the model spec (the files:
``deploy.serving.layout``). The entry is built in a folder beside the repository and renamed into place, so a
server never sees half of it. The export measures what the reduction cost (size; validation perplexity when the
dataset is still there) and records the checkpoint's own greedy generation for a prompt, which the deployment's
smoke check compares with what the server answers. Its report is printed as one JSON line and kept in serving.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from deploy.quality import model_with, reduction_report, validation_tokens_for
from deploy.reduce import REDUCTIONS, dequantize_state, reduce_state
from deploy.reshard import shard_problems, shard_state
from deploy.serving import layout
from trainer.checkpoint.consolidated import checkpoint_state
from trainer.contract.manifest import read_manifest
from trainer.generate import generate

SERVING_PACKAGE = Path(__file__).parent / "serving"
PACKAGE_NAME = "workbench_serving"
SMOKE_PROMPT, SMOKE_TOKENS = "\n", 16
# Compute precision by reduction: the GPU computes in the stored half precision (int8 dequantises to fp16);
# the CPU computes in fp32 whatever is stored, which is also what the smoke check's reference does.
GPU_DTYPE = {"none": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "float16"}


class ExportError(ValueError):
    """The export was refused; the message says what to change."""


@dataclass(frozen=True)
class ExportOptions:
    name: str
    reduction: str = "none"
    tensor_parallel: int = 1
    instances: int = 1
    kind: str = "cpu"            # instance kind: "cpu" (KIND_CPU) or "gpu" (KIND_GPU, tensor_parallel GPUs each)
    max_sequences: int = 16      # the engine's slots: sequences decoded together at most
    streaming: bool = True       # decoupled: one response per token; otherwise one response per request
    measure: bool = True         # validation perplexity of the reduced weights against fp32

    def problems(self) -> list[str]:
        found = []
        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            found.append(f"name {self.name!r}: use letters, digits, '-' and '_'")
        if self.reduction not in REDUCTIONS:
            found.append(f"reduction {self.reduction!r}: choose one of {', '.join(REDUCTIONS)}")
        if self.instances < 1 or self.max_sequences < 1:
            found.append(f"instances={self.instances} and max_sequences={self.max_sequences} must be at least 1")
        if self.kind not in ("cpu", "gpu"):
            found.append(f"kind {self.kind!r}: choose cpu or gpu")
        return found


def config_pbtxt(options: ExportOptions) -> str:
    """Triton's model configuration. max_batch_size is 0: requests are batched inside the model, step by step
    (the engine's max_sequences), not by Triton's batcher, which would hold whole requests together."""
    inputs = [("text_input", "TYPE_STRING", "[ 1 ]", False), ("max_tokens", "TYPE_INT32", "[ 1 ]", True),
              ("temperature", "TYPE_FP32", "[ 1 ]", True), ("top_k", "TYPE_INT32", "[ 1 ]", True),
              ("top_p", "TYPE_FP32", "[ 1 ]", True), ("seed", "TYPE_INT64", "[ 1 ]", True),
              ("stop", "TYPE_STRING", "[ -1 ]", True), ("stream", "TYPE_BOOL", "[ 1 ]", True)]
    outputs = [("text_output", "TYPE_STRING", "[ 1 ]"), ("token_ids", "TYPE_INT32", "[ -1 ]"),
               ("finish_reason", "TYPE_STRING", "[ 1 ]"), ("prompt_tokens", "TYPE_INT32", "[ 1 ]"),
               ("completion_tokens", "TYPE_INT32", "[ 1 ]")]
    if options.kind == "gpu":  # each instance's ranks take tensor_parallel consecutive GPUs from its first
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
    for key, value in (("tensor_parallel", options.tensor_parallel), ("max_sequences", options.max_sequences)):
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


def export(checkpoint: str | Path, repository: str | Path, options: ExportOptions) -> dict:
    """Write ``<repository>/<options.name>`` from ``checkpoint``; return the report (also in serving.json)."""
    checkpoint, repository = Path(checkpoint), Path(repository)
    problems = options.problems()
    manifest = read_manifest(checkpoint)
    if manifest is None:
        problems.append(f"{checkpoint} has no manifest.json: not a complete checkpoint")
    elif not manifest.tokenizer or not Path(manifest.tokenizer).is_file():
        problems.append(f"the checkpoint's tokenizer ({manifest.tokenizer or 'none recorded'}) is missing: a served "
                        "model takes and returns text; import or prepare the dataset's tokenizer again")
    else:
        problems += shard_problems(manifest.model_spec(), options.tensor_parallel)
    if problems:
        raise ExportError("; ".join(problems))
    spec = manifest.model_spec()
    started = time.perf_counter()
    state = checkpoint_state(checkpoint)
    reduced = reduce_state(state, options.reduction)
    val_tokens = validation_tokens_for(checkpoint) if options.measure else None
    report = reduction_report(state, spec, options.reduction, val_tokens)
    reference = model_with(dequantize_state(reduced), spec)
    codec = layout.Codec(Path(manifest.tokenizer))
    prompt_ids = codec.encode(SMOKE_PROMPT)
    smoke_ids = generate(reference, prompt_ids, SMOKE_TOKENS, temperature=0)[len(prompt_ids):]
    report.update(
        name=options.name, path=str((repository / options.name).resolve()), checkpoint=str(checkpoint.resolve()),
        step=manifest.step, tensor_parallel=options.tensor_parallel, instances=options.instances,
        kind=options.kind, streaming=options.streaming, seq_len=spec.seq_len,
        compute_dtype_cpu="float32", compute_dtype_gpu=GPU_DTYPE[options.reduction],
        smoke={"prompt": SMOKE_PROMPT, "max_tokens": SMOKE_TOKENS, "token_ids": smoke_ids,
               "text": codec.decode(smoke_ids)})

    repository.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{options.name}-", dir=repository.parent))
    try:
        version = staging / "1"
        (version / layout.WEIGHTS).mkdir(parents=True)
        for rank, shard in enumerate(shard_state(reduced, spec, options.tensor_parallel)):
            save_file(shard, str(layout.shard_file(version, rank)))
        _copy_serving_code(version)
        shutil.copyfile(manifest.tokenizer, version / layout.TOKENIZER)
        (version / layout.MODEL_SPEC).write_text(json.dumps(spec.to_dict(), indent=2))
        report["export_seconds"] = round(time.perf_counter() - started, 3)
        (version / layout.SERVING).write_text(json.dumps(report, indent=2))
        (staging / "config.pbtxt").write_text(config_pbtxt(options))
        staging.chmod(0o755)
        _replace(repository / options.name, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _replace(target: Path, staging: Path) -> None:
    """Put ``staging`` at ``target``; an entry already there is moved aside first and removed after."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}-old-{time.time_ns()}")
        target.rename(old)
    staging.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def run(args: argparse.Namespace) -> int:
    """A checkpoint → a Triton model-repository entry (reduced, split, with its serving code)."""
    options = ExportOptions(name=args.name, reduction=args.reduction, tensor_parallel=args.tensor_parallel,
                            instances=args.instances, kind=args.kind, max_sequences=args.max_sequences,
                            streaming=args.streaming, measure=args.measure)
    try:
        report = export(args.checkpoint, args.repository, options)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0

