"""What vLLM can serve on this machine: the rules of ``deploy.vllm.rules`` (the spec and the options, standard
library only, which the web app checks too) with this machine's cores, and whether vLLM is installed here."""
from __future__ import annotations

import importlib.util

from deploy.vllm import rules
from deploy.vllm.rules import VLLM_DTYPES  # noqa: F401 (deploy.vllm.entry's dtypes)
from trainer.contract import ModelSpec


def vllm_installed() -> bool:
    """Whether this Python environment (the one a local Triton's Python backend runs) has vLLM."""
    return importlib.util.find_spec("vllm") is not None


def problems(spec: ModelSpec, reduction: str, tensor_parallel: int, kind: str) -> list[str]:
    """Why vLLM cannot serve ``spec`` reduced by ``reduction`` over ``tensor_parallel`` ranks on ``kind``
    ("cpu" or "gpu") on this machine; empty when it can."""
    return rules.problems(spec, reduction, tensor_parallel, kind, cpu_cores=rules.usable_cpu_cores())
