"""The rules a plan must follow: against its model and cluster, and what each engine cannot do.

Standard library only, and free of the spec classes (``specs`` imports this module): the functions read fields of
the specs they are given. These are the only engine refusals in the project; the web app, the planner and the
trainer all ask here, so a plan the contract accepts is a plan the trainer runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: specs.py imports this module
    from trainer.contract.specs import ClusterSpec, ModelSpec, ParallelPlan

Problems = dict[str, list[str]]


def add_problem(problems: Problems, key: str, message: str) -> None:
    problems.setdefault(key, []).append(message)


def positive(problems: Problems, obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            add_problem(problems, name, f"{name}={value} must be positive")


def engine_problems(plan: ParallelPlan) -> Problems:
    """What each engine cannot do, refused before any work."""
    p: Problems = {}
    if plan.engine == "native":
        if plan.zero_stage in (1, 2):
            add_problem(p, "zero_stage", f"the native engine shards with FSDP2 (zero_stage=3) or not at all (0); "
                                         f"zero_stage={plan.zero_stage} needs engine='deepspeed'")
        if plan.offload_optimizer or plan.offload_params:
            add_problem(p, "offload_optimizer" if plan.offload_optimizer else "offload_params",
                        "CPU offload needs engine='deepspeed'")
    else:
        if plan.tp > 1 or plan.sequence_parallel:
            add_problem(p, "tp", f"the deepspeed engine does not do tensor or sequence parallel (tp={plan.tp}); "
                                 f"use engine='native'")
        if plan.pp > 1 and plan.zero_stage != 1:
            # Stage 2/3 partition gradients that the pipeline engine accumulates over micro-batches; at stage 0 its
            # clipping does not use the global gradient norm (measured: losses drift 2.5e-4 from the native run).
            add_problem(p, "zero_stage", f"DeepSpeed's pipeline engine runs here with ZeRO stage 1 only, got "
                                         f"{plan.zero_stage}")
        if plan.pp > 1 and plan.pipeline_schedule != "1f1b":
            add_problem(p, "pipeline_schedule", f"DeepSpeed's pipeline engine runs its own 1F1B schedule, "
                                                f"not '{plan.pipeline_schedule}'")
        if plan.offload_params and plan.zero_stage != 3:
            add_problem(p, "offload_params", f"parameter offload needs zero_stage=3, got {plan.zero_stage}")
        if plan.offload_optimizer and plan.zero_stage == 0:
            add_problem(p, "offload_optimizer", "optimizer offload needs zero_stage ≥ 1")
    if plan.precision == "fp16" and plan.engine == "native" and plan.zero_stage == 3:
        add_problem(p, "precision", "fp16 loss scaling with FSDP2 is not supported; use bf16 or fp32")
    return p


def check_plan(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> Problems:
    """How ``plan`` does not fit ``model`` (and ``cluster``, if given). Keys are plan fields; empty when it fits."""
    p: Problems = {}
    if plan.tp > 1:
        if model.n_heads % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide n_heads={model.n_heads}")
        if model.kv_heads != model.n_heads and model.kv_heads % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide n_kv_heads={model.kv_heads}")
        if model.ffn % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide ffn_hidden={model.ffn}")
    if plan.sequence_parallel and model.seq_len % plan.tp:
        add_problem(p, "sequence_parallel", f"tp={plan.tp} does not divide seq_len={model.seq_len}")
    chunks = plan.pp * plan.virtual_stages
    if plan.pp > 1 and model.n_layers % chunks:
        what = f"pp×virtual_stages={plan.pp}×{plan.virtual_stages}={chunks}" if plan.virtual_stages > 1 \
            else f"pp={plan.pp}"
        add_problem(p, "pp", f"{what} does not divide n_layers={model.n_layers}")
    if plan.ep > 1 and not model.is_moe:
        add_problem(p, "ep", f"ep={plan.ep} needs a mixture-of-experts model; this one is dense")
    if model.is_moe and plan.ep > 1 and model.n_experts % plan.ep:
        add_problem(p, "ep", f"ep={plan.ep} does not divide n_experts={model.n_experts}")
    if model.is_moe and plan.engine == "deepspeed" and plan.zero_stage == 3:
        add_problem(p, "zero_stage", "DeepSpeed's mixture of experts does not support ZeRO stage 3; "
                                     "use zero_stage ≤ 2")
    if model.is_moe and plan.pp > 1:
        add_problem(p, "pp", "mixture-of-experts models are not pipelined here; use pp=1")
    if model.is_moe and plan.tp > 1:
        add_problem(p, "tp", f"mixture-of-experts layers are not split by tensor parallel here (tp={plan.tp}); "
                             f"spread the experts over data-parallel ranks with ep instead")
    if model.is_moe and plan.engine == "native" and plan.zero_stage == 3:
        add_problem(p, "zero_stage", "the native engine does not shard mixture-of-experts models with FSDP2 "
                                     "(zero_stage=3); use zero_stage=0, or engine='deepspeed' with zero_stage ≤ 2")
    if cluster is not None and plan.world_size != cluster.world_size:
        add_problem(p, "", f"dp×tp×pp={plan.dp}×{plan.tp}×{plan.pp}={plan.world_size} but the cluster has "
                           f"{cluster.world_size} GPUs ({cluster.nodes} node(s) × {cluster.gpus_per_node})")
    if cluster is not None and plan.tp > cluster.gpus_per_node:
        add_problem(p, "tp", f"tp={plan.tp} spans nodes: keep it within gpus_per_node={cluster.gpus_per_node}")
    return p
