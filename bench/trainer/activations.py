"""Section 3 of ``python -m bench.trainer``: the activations autograd saves for one micro-batch under none, selective
and full activation checkpointing (measured with saved_tensors_hooks), beside Korthikanti et al.'s per-layer formula
for this layer in fp32 without dropout (docs/formulas.md, Activation memory); and for the Llama, Mixtral and
Qwen2-MoE families (RMSNorm, SwiGLU, routed and shared experts), the measurement beside the planner's figure.
"""
from __future__ import annotations

import copy

import torch

from bench.trainer.common import bench_model
from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.model import build_model, loss_fn
from trainer.parallel.ac import apply_ac
from trainer.planner.estimate.core import Planner
from trainer.profiling.memory import SavedActivations

# The family cases section 3 prints and tests/trainer/planner/test_families.py holds to 1 %: (preset, micro-batch,
# checkpointing, precision, zero stage). bf16 with zero stage 0 is autocast over fp32 weights (the native engine
# without FSDP); with stage 3 the model cast to bf16, as FSDP2's mixed-precision policy runs it.
FAMILY_CASES = [(name, 2, mode, precision, zero)
                for name in ("tiny-llama", "tiny-mixtral", "tiny-qwen-moe")
                for mode, precision, zero in (("none", "fp32", 0), ("selective", "fp32", 0), ("full", "fp32", 0),
                                              ("none", "bf16", 0), ("none", "bf16", 3))]


def measure_saved(spec: ModelSpec, micro_batch: int, checkpointing: str = "none", precision: str = "fp32",
                  zero_stage: int = 0, seed: int = 0) -> int:
    """Bytes autograd saves for the forward of one micro-batch of the whole model with its loss, on the CPU: the
    trainer's own model, checkpointing and precision (autocast, or for FSDP2's policy the model cast to bf16)."""
    torch.manual_seed(seed)
    model = build_model(spec, seed)
    model.train()
    apply_ac(model, checkpointing)
    cast = precision != "fp32" and zero_stage == 3
    autocast = precision != "fp32" and not cast
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    if cast:
        model = copy.deepcopy(model).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len), generator=gen)
    targets = torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len), generator=gen)
    with SavedActivations(model.parameters()) as probe:
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            loss_fn(model(idx), targets)
    return probe.bytes


def planned_saved(spec: ModelSpec, micro_batch: int, checkpointing: str = "none", precision: str = "fp32",
                  zero_stage: int = 0) -> float:
    """The planner's activations of one micro-batch for the same model and plan on one CPU rank."""
    plan = ParallelPlan(micro_batch=micro_batch, global_batch=micro_batch, activation_checkpointing=checkpointing,
                        precision=precision, zero_stage=zero_stage)
    return sum(Planner(spec, local_cpu_cluster(1)).stage_memory(plan, 0).activations_per_microbatch.values())


def family_rows(cases=FAMILY_CASES) -> list[dict]:
    """Measured and planned saved bytes of each family case."""
    rows = []
    for name, b, mode, precision, zero in cases:
        spec = MODELS[name]
        measured = measure_saved(spec, b, mode, precision, zero)
        planned = planned_saved(spec, b, mode, precision, zero)
        rows.append({"model": name, "micro_batch": b, "mode": mode, "precision": precision, "zero_stage": zero,
                     "measured": measured, "planned": planned, "ratio": planned / measured})
    return rows


def saved_activations(micro_batch: int = 2, **model_changes) -> list[dict]:
    spec = bench_model().replace(**model_changes)
    s, b, h, L = spec.seq_len, micro_batch, spec.d_model, spec.n_layers
    rows = [{"mode": mode, "bytes": measure_saved(spec, b, mode)} for mode in ("none", "selective", "full")]
    # Korthikanti Table 2 for fp32 without dropout: every 2-byte term doubles, mask terms vanish:
    # s·b·h·(34 − 2)·2 + the attention scores 5·a·s²·b → (4·a·s²·b for softmax in/out in fp32, 0 with a fused kernel)
    korthikanti_none = L * s * b * h * 32 * 2
    korthikanti_full = L * 2 * s * b * h * 2
    for r in rows:
        r["ratio_to_none"] = rows[0]["bytes"] / r["bytes"]
    return rows + [{"formula_layers_none_fused_attention": korthikanti_none,
                    "formula_layers_full": korthikanti_full}]
