"""A Hugging Face model folder → a Triton model entry served by TensorRT-LLM's LLM-API backend, for GPU servers.

    python -m deploy export-trtllm SOURCE REPOSITORY --name NAME [--tensor-parallel 1] [--pipeline-parallel 1]
        [--max-batch-size 64] [--dtype bfloat16] [--max-seq-len N] [--no-stream] [--model-path PATH]
        [--backend-files DIR]

SOURCE is a Hugging Face model folder (``python -m deploy export-hf``) or a checkpoint folder, which is exported to
that layout on the way. NVIDIA serves TensorRT-LLM in Triton through its LLM-API backend: a Python-backend model
whose ``model.py`` builds ``tensorrt_llm.LLM`` from the keys of a ``model.yaml`` beside it (its ``triton_config``
key sets Triton's batching and whether the model streams, which is why config.pbtxt leaves both out). The entry:

    REPOSITORY/NAME/config.pbtxt         backend "python", the inputs and outputs the backend reads and writes
    REPOSITORY/NAME/1/model.yaml         the LLM's arguments: model path, backend, parallel sizes, dtype, limits
    REPOSITORY/NAME/1/hf/                the Hugging Face folder the LLM loads
    REPOSITORY/NAME/1/model.py, helpers.py   TensorRT-LLM's own backend files, copied from --backend-files
                                         (triton_backend/all_models/llmapi/tensorrt_llm/1 of a TensorRT-LLM tree,
                                         or its Triton container); without it they are left to copy by hand

Nothing here imports TensorRT-LLM: the entry is written on any machine and served where a GPU and TensorRT-LLM's
Triton container are. Its interface is TensorRT-LLM's, not this project's engine's: ``text_input``,
``sampling_param_max_tokens``, ``streaming`` in; ``text_output`` out (``/v2/models/NAME/generate`` takes them as
JSON), so the web app's client does not talk to it.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from deploy.staging import staged

MODEL_YAML = "model.yaml"
HF_FOLDER = "hf"
BACKEND_FILES = ("model.py", "helpers.py")
DTYPES = ("auto", "bfloat16", "float16", "float32")
# The inputs TensorRT-LLM's LLM-API model reads (optional but text_input) and the outputs it writes when asked.
_INPUTS = [("text_input", "TYPE_STRING", "[ -1 ]", False), ("streaming", "TYPE_BOOL", "[ 1 ]", True),
           ("sampling_param_max_tokens", "TYPE_INT32", "[ 1 ]", True),
           ("sampling_param_temperature", "TYPE_FP32", "[ 1 ]", True),
           ("sampling_param_top_k", "TYPE_INT32", "[ 1 ]", True), ("sampling_param_top_p", "TYPE_FP32", "[ 1 ]", True),
           ("sampling_param_frequency_penalty", "TYPE_FP32", "[ 1 ]", True),
           ("sampling_param_presence_penalty", "TYPE_FP32", "[ 1 ]", True),
           ("sampling_param_seed", "TYPE_UINT64", "[ 1 ]", True),
           ("sampling_param_stop", "TYPE_STRING", "[ -1 ]", True),
           ("sampling_param_exclude_input_from_output", "TYPE_BOOL", "[ 1 ]", True),
           ("return_finish_reason", "TYPE_BOOL", "[ 1 ]", True), ("stop", "TYPE_BOOL", "[ 1 ]", True)]
_OUTPUTS = [("text_output", "TYPE_STRING", "[ -1 ]"), ("finish_reason", "TYPE_STRING", "[ -1 ]")]


class TrtllmEntryError(ValueError):
    """A source or an option the entry cannot be written from; the message says what to change."""


@dataclass(frozen=True)
class TrtllmOptions:
    name: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    max_batch_size: int = 64          # sequences the LLM schedules together (its in-flight batch)
    dtype: str = ""                   # "" → the folder's half precision, else bfloat16 (what a GPU serves)
    max_seq_len: int = 0              # 0 → the model's context
    streaming: bool = True            # decoupled: one response per step
    model_path: str = ""              # where the GPU server sees the hf folder ("" → this entry's, absolute)


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise TrtllmEntryError(f"{folder} has no config.json: give a Hugging Face model folder "
                               f"(python -m deploy export-hf) or a checkpoint folder")
    return json.loads(path.read_text())


def model_facts(config: dict[str, Any]) -> dict[str, Any]:
    """Heads, layers, context and stored dtype of a Hugging Face config.json, whatever its family's key names."""
    def first(*keys: str) -> Any:
        return next((config[k] for k in keys if config.get(k) is not None), None)
    return {"heads": first("num_attention_heads", "n_head"), "layers": first("num_hidden_layers", "n_layer"),
            "context": first("max_position_embeddings", "n_positions"),
            "dtype": first("dtype", "torch_dtype") or "float32"}


def llm_arguments(config: dict[str, Any], options: TrtllmOptions, model_path: str) -> dict[str, Any]:
    """model.yaml's keys: ``tensorrt_llm.LLM``'s arguments, and ``triton_config`` for the backend."""
    facts = model_facts(config)
    problems = []
    if not options.name or not all(c.isalnum() or c in "-_" for c in options.name):
        problems.append(f"name {options.name!r}: use letters, digits, '-' and '_'")
    if options.tensor_parallel < 1 or (facts["heads"] and facts["heads"] % options.tensor_parallel):
        problems.append(f"tensor_parallel={options.tensor_parallel} must divide the {facts['heads']} attention heads")
    if options.pipeline_parallel < 1 or (facts["layers"] and facts["layers"] < options.pipeline_parallel):
        problems.append(f"pipeline_parallel={options.pipeline_parallel} must be 1 to the {facts['layers']} layers")
    if options.max_batch_size < 1:
        problems.append(f"max_batch_size={options.max_batch_size} must be at least 1")
    if options.dtype and options.dtype not in DTYPES:
        problems.append(f"dtype {options.dtype!r}: choose one of {', '.join(DTYPES)}")
    context = facts["context"]
    if options.max_seq_len < 0 or (context and options.max_seq_len > context):
        problems.append(f"max_seq_len={options.max_seq_len} must be 1 to the model's context {context} (0: all)")
    if problems:
        raise TrtllmEntryError("; ".join(problems))
    stored = str(facts["dtype"])
    dtype = options.dtype or (stored if stored in ("bfloat16", "float16") else "bfloat16")
    arguments: dict[str, Any] = {
        "model": model_path, "backend": "pytorch",
        "tensor_parallel_size": options.tensor_parallel, "pipeline_parallel_size": options.pipeline_parallel,
        "dtype": dtype, "max_batch_size": options.max_batch_size}
    if options.max_seq_len or context:
        arguments["max_seq_len"] = options.max_seq_len or context
    # Triton batches nothing itself (max_batch_size 0): the LLM batches in flight, step by step.
    arguments["triton_config"] = {"max_batch_size": 0, "decoupled": options.streaming}
    return arguments


def _yaml_scalar(value: Any) -> str:
    # JSON's strings, numbers and booleans are YAML's too, so no YAML library is needed to write them.
    return json.dumps(value)


def model_yaml(arguments: dict[str, Any]) -> str:
    lines = ["# tensorrt_llm.LLM's arguments (written by python -m deploy export-trtllm); triton_config is the",
             "# backend's: Triton's batch size (0: the LLM batches in flight) and decoupled (streaming)."]
    for key, value in arguments.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {_yaml_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {_yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def config_pbtxt(name: str, tensor_parallel: int, pipeline_parallel: int) -> str:
    """One KIND_CPU instance: the model's process is the leader that starts the LLM's GPU workers (one per rank,
    tensor_parallel × pipeline_parallel of them), so Triton places no GPU itself."""
    inputs = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {d}{" optional: true" if o else ""} }}'
                        for n, t, d, o in _INPUTS)
    outputs = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in _OUTPUTS)
    return "\n".join([
        f'name: "{name}"', 'backend: "python"',
        f"# max_batch_size and decoupled come from {MODEL_YAML}'s triton_config (the backend sets them at load)",
        f"# ranks: tensor_parallel {tensor_parallel} x pipeline_parallel {pipeline_parallel} GPUs",
        "instance_group [\n  { kind: KIND_CPU count: 1 }\n]",
        "input [\n" + inputs + "\n]", "output [\n" + outputs + "\n]"]) + "\n"


def _fill_hf_folder(source: Path, target: Path) -> None:
    if (source / "config.json").is_file():
        shutil.copytree(source, target)
    elif (source / "manifest.json").is_file():
        from deploy.hf_export import HFExportError, export_hf
        try:
            export_hf(source, target)
        except HFExportError as exc:
            raise TrtllmEntryError(str(exc)) from exc
    else:
        raise TrtllmEntryError(f"{source} is neither a Hugging Face model folder (config.json) nor a checkpoint "
                               f"(manifest.json)")


def write_trtllm_entry(source: Path, repository: Path, options: TrtllmOptions,
                       backend_files: Optional[Path] = None) -> dict[str, Any]:
    """Write ``repository/options.name`` from ``source``; return what was written (path, model.yaml's arguments,
    whether TensorRT-LLM's backend files are in place)."""
    source, repository = Path(source), Path(repository)
    if not source.is_dir():
        raise TrtllmEntryError(f"{source} is not a folder")
    if backend_files is not None:
        missing = [f for f in BACKEND_FILES if not (Path(backend_files) / f).is_file()]
        if missing:
            raise TrtllmEntryError(f"{backend_files} lacks {', '.join(missing)}: give TensorRT-LLM's "
                                   f"triton_backend/all_models/llmapi/tensorrt_llm/1 folder")
    if (source / "config.json").is_file():
        llm_arguments(_read_config(source), options, "")  # refuse before copying anything
    entry = repository / options.name
    model_path = options.model_path or str((entry / "1" / HF_FOLDER).resolve())
    with staged(entry) as staging:
        version = staging / "1"
        version.mkdir()
        _fill_hf_folder(source, version / HF_FOLDER)
        arguments = llm_arguments(_read_config(version / HF_FOLDER), options, model_path)
        (version / MODEL_YAML).write_text(model_yaml(arguments))
        (staging / "config.pbtxt").write_text(
            config_pbtxt(options.name, options.tensor_parallel, options.pipeline_parallel))
        if backend_files is not None:
            for name in BACKEND_FILES:
                shutil.copyfile(Path(backend_files) / name, version / name)
    return {"path": str(entry.resolve()), "arguments": arguments, "backend_files": backend_files is not None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="a Hugging Face model folder or a checkpoint folder")
    parser.add_argument("repository", type=Path, help="the Triton model repository to write the entry in")
    parser.add_argument("--name", required=True, help="the model's name in Triton")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="GPUs a layer is split over")
    parser.add_argument("--pipeline-parallel", type=int, default=1, help="GPUs the layers are staged over")
    parser.add_argument("--max-batch-size", type=int, default=64, help="sequences decoded together at most")
    parser.add_argument("--dtype", default="", choices=("",) + DTYPES,
                        help="compute dtype (default: the folder's half precision, else bfloat16)")
    parser.add_argument("--max-seq-len", type=int, default=0, help="prompt + answer tokens at most (0: the context)")
    parser.add_argument("--no-stream", dest="streaming", action="store_false",
                        help="one response per request (not decoupled)")
    parser.add_argument("--model-path", default="",
                        help="the hf folder's path as the GPU server sees it (default: this entry's, absolute)")
    parser.add_argument("--backend-files", type=Path, default=None,
                        help="TensorRT-LLM's llmapi model folder holding model.py and helpers.py, copied in")


def run(args: argparse.Namespace) -> int:
    """A Hugging Face folder or checkpoint → a Triton entry for TensorRT-LLM's LLM-API backend (GPU servers)."""
    options = TrtllmOptions(name=args.name, tensor_parallel=args.tensor_parallel,
                            pipeline_parallel=args.pipeline_parallel, max_batch_size=args.max_batch_size,
                            dtype=args.dtype, max_seq_len=args.max_seq_len, streaming=args.streaming,
                            model_path=args.model_path)
    try:
        report = write_trtllm_entry(args.source, args.repository, options, args.backend_files)
    except TrtllmEntryError as exc:
        print(f"export-trtllm refused: {exc}", file=sys.stderr)
        return 2
    if not report["backend_files"]:
        print(f"note: copy TensorRT-LLM's {' and '.join(BACKEND_FILES)} (triton_backend/all_models/llmapi/"
              f"tensorrt_llm/1) into {report['path']}/1 before serving, or pass --backend-files", file=sys.stderr)
    print(json.dumps(report))
    return 0
