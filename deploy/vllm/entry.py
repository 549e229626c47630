"""A checkpoint → a Triton model-repository entry served by vLLM (``python -m deploy export --engine vllm``).

    <repository>/<name>/config.pbtxt      the workbench engine's inputs and outputs (deploy.export.config_pbtxt)
    <repository>/<name>/1/model.py        deploy/vllm/triton_model.py: vLLM's AsyncLLM in Triton's Python backend
    <repository>/<name>/1/triton_io.py    deploy/serving/triton_io.py: inputs, responses and metrics, as ours
    <repository>/<name>/1/hf/             the checkpoint in the Hugging Face layout (deploy.hf_export), in the dtype
                                          vLLM computes in
    <repository>/<name>/1/serving.json    the export's report, with vLLM's engine arguments under "vllm"

A model vLLM cannot serve (``deploy.vllm.support``) is refused before any weight is read. The checkpoint is then
prepared as for the workbench engine (``deploy.prepare``: reduced, measured, and its greedy tokens recorded as the
smoke check's reference), so a deployment's smoke check is the same whichever engine serves it.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from deploy.export import ExportOptions, config_pbtxt, serving_report
from deploy.hf_export import HFExportError, export_hf
from deploy.prepare import ExportError, PrepareOptions, prepare
from deploy.staging import staged
from deploy.vllm import support
from trainer.contract import ModelSpec
from trainer.contract.manifest import read_manifest

TRITON_MODEL = Path(__file__).parent / "triton_model.py"
# the requests, responses and metrics every engine's model shares, copied beside model.py
TRITON_IO = Path(__file__).parent.parent / "serving" / "triton_io.py"
HF_FOLDER, SERVING = "hf", "serving.json"  # the names triton_model.py reads
MIN_KV_CACHE_BYTES = 64 * 2 ** 20
# On the CPU vLLM compiles nothing (torch.compile of a model takes minutes there) and schedules at most this many
# prompt tokens a step (its profiling and warm-up run that many; more only slows the load of a small model).
CPU_BATCHED_TOKENS = 256


def kv_cache_bytes(spec: ModelSpec, max_sequences: int, dtype: str) -> int:
    """The CPU KV cache vLLM is given: every slot's whole window, twice over for its block rounding. On the CPU
    vLLM would otherwise reserve a share of the host's memory (gpu_memory_utilization; 0.92 by default)."""
    per_token = spec.n_layers * 2 * spec.kv_heads * spec.head_dim * (4 if dtype == "float32" else 2)
    return max(MIN_KV_CACHE_BYTES, 2 * per_token * spec.seq_len * max_sequences)


def engine_arguments(spec: ModelSpec, options: ExportOptions) -> dict[str, Any]:
    """vLLM's AsyncEngineArgs (but the model folder) for ``spec`` served as ``options`` ask."""
    dtype = support.VLLM_DTYPES[options.reduction]
    arguments: dict[str, Any] = {
        "dtype": dtype, "tensor_parallel_size": options.tensor_parallel, "max_model_len": spec.seq_len,
        "max_num_seqs": options.max_sequences, "seed": 0,
        "disable_log_stats": True}  # the model's own stat logger feeds Triton's metrics
    if options.kind == "cpu":
        arguments.update(enforce_eager=True, kv_cache_memory_bytes=kv_cache_bytes(spec, options.max_sequences, dtype),
                         max_num_batched_tokens=max(CPU_BATCHED_TOKENS, spec.seq_len))
    return arguments


def problems(checkpoint: Path, options: ExportOptions) -> list[str]:
    """Why ``checkpoint`` cannot be served by vLLM as ``options`` ask (the manifest is read, no weight)."""
    found = options.problems()
    manifest = read_manifest(checkpoint)
    if manifest is None:
        return found + [f"{checkpoint} has no manifest.json: not a complete checkpoint"]
    found += support.problems(manifest.model_spec(), options.reduction, options.tensor_parallel, options.kind)
    if not found and not support.vllm_installed():
        found.append("vLLM is not installed in this Python environment, which the local Triton's Python backend "
                     "runs: scripts/setup-env.sh installs it, or deploy with the workbench engine")
    return found


def export(checkpoint: str | Path, repository: str | Path, options: ExportOptions) -> dict:
    """``checkpoint`` written as ``<repository>/<options.name>``, served by vLLM; return the report (also in
    serving.json). ExportError, before any weight is read, for what vLLM cannot serve."""
    checkpoint = Path(checkpoint)
    found = problems(checkpoint, options)
    if found:
        raise ExportError("; ".join(found))
    # vLLM splits the weights itself: prepared whole, for the reduction's report and the smoke reference
    prepared = prepare(checkpoint, PrepareOptions(reduction=options.reduction, measure=options.measure))
    started = time.perf_counter()
    arguments = engine_arguments(prepared.spec, options)
    entry = Path(repository) / options.name
    with staged(entry) as staging:
        version = staging / "1"
        version.mkdir()
        try:
            hf = export_hf(checkpoint, version / HF_FOLDER, dtype=arguments["dtype"])
        except HFExportError as exc:
            raise ExportError(f"the Hugging Face layout vLLM loads could not be written: {exc}") from None
        shutil.copyfile(TRITON_MODEL, version / "model.py")
        shutil.copyfile(TRITON_IO, version / TRITON_IO.name)
        report = serving_report(prepared, options, entry, prepared.seconds + time.perf_counter() - started)
        report.update(compute_dtype_cpu=arguments["dtype"], compute_dtype_gpu=arguments["dtype"],
                      vllm=arguments, hf_model_type=hf["model_type"])
        (version / SERVING).write_text(json.dumps(report, indent=2))
        (staging / "config.pbtxt").write_text(config_pbtxt(options))
    return report
