"""What vLLM can serve, decided from the model spec and the options alone: standard library only, so that the web
app refuses a deployment before any worker exports it, with the reason the export would give.

vLLM loads the Hugging Face folder that ``deploy.hf_export`` writes, so a model must first be one export-hf can
write (``deploy.hf_classes``: a GPT-2, Llama, Qwen2, Mixtral or Qwen2-MoE class that computes it exactly); then vLLM
must have that class and kernels for its shape and precision on the device that serves it. Each refusal names what
to change.
"""
from __future__ import annotations

import os

from deploy.hf_classes import ARCHITECTURES, LayoutError, model_type_of
from trainer.contract import ModelSpec

# The architectures of vLLM 0.32's model registry among those export-hf writes (all of them).
VLLM_ARCHITECTURES = frozenset({"GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM",
                                "Qwen2MoeForCausalLM"})
# The head sizes vLLM 0.32's CPU attention backend has kernels for (CPUAttentionBackend.get_supported_head_sizes);
# tests/deploy/test_vllm_serving.py checks this against the installed vLLM.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# The reductions vLLM computes in: its dtype for the model (the Hugging Face weights are written in it).
VLLM_DTYPES = {"none": "float32", "bf16": "bfloat16", "fp16": "float16"}
# vLLM's CPU backend keeps one core for its engine process and binds each tensor-parallel rank's threads to cores of
# their own.
CPU_RESERVED_CORES = 1


def usable_cpu_cores() -> int:
    """The cores vLLM's CPU backend can give its ranks on this machine."""
    return max(1, len(os.sched_getaffinity(0)) - CPU_RESERVED_CORES)


def problems(spec: ModelSpec, reduction: str, tensor_parallel: int, kind: str,
             cpu_cores: int | None = None) -> list[str]:
    """Why vLLM cannot serve ``spec`` reduced by ``reduction`` over ``tensor_parallel`` ranks on ``kind``
    ("cpu" or "gpu"); empty when it can. ``cpu_cores``: the cores vLLM may give its ranks on a CPU server (None:
    unknown, not checked)."""
    found = []
    try:
        architecture = ARCHITECTURES[model_type_of(spec)]
    except LayoutError as exc:
        found.append(f"vLLM loads the Hugging Face layout and {exc}")
        architecture = None
    if architecture is not None and architecture not in VLLM_ARCHITECTURES:
        found.append(f"vLLM has no {architecture}: serve it with the workbench engine")
    if kind == "cpu" and spec.head_dim not in CPU_HEAD_SIZES:
        found.append(f"head_dim {spec.head_dim} (d_model {spec.d_model} / n_heads {spec.n_heads}): vLLM's CPU "
                     f"attention has kernels for head sizes {', '.join(map(str, CPU_HEAD_SIZES))} only; serve it "
                     f"with the workbench engine, or train a model whose head size is one of these")
    if reduction == "int8":
        found.append("reduction int8: vLLM loads int8 only from checkpoints quantized for its kernels "
                     "(compressed-tensors W8A8, GPTQ, AWQ), not the workbench's per-channel int8 weights; choose "
                     "bf16 or none, or the workbench engine for int8")
    elif reduction not in VLLM_DTYPES:
        found.append(f"reduction {reduction!r}: vLLM serves {', '.join(VLLM_DTYPES)}")
    if tensor_parallel > 1:
        if spec.n_heads % tensor_parallel:
            found.append(f"tensor_parallel {tensor_parallel}: vLLM splits the {spec.n_heads} attention heads "
                         f"evenly over its ranks; choose a divisor of {spec.n_heads}")
        if kind == "cpu" and cpu_cores is not None and tensor_parallel > cpu_cores:
            found.append(f"tensor_parallel {tensor_parallel}: vLLM's CPU backend gives each rank cores of its own "
                         f"and keeps {CPU_RESERVED_CORES} for its engine; this machine has {cpu_cores} "
                         f"to give: choose tensor_parallel 1, or a GPU server")
    return found
