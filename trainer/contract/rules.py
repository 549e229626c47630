"""Every rule a plan must follow: alone, against its model and cluster, and what each engine and device cannot do;
and the limit on every number of the contract.

This is the only place that decides whether a plan runs: ``ParallelPlan.problems()`` and a RunSpec's validation call
the functions here, and the web app, the planner's tuner and the trainer ask the same ones, so a plan the contract
accepts is a plan the trainer runs. The specs check their other fields themselves (a model's heads divide its width).

Standard library only. ``specs`` imports this module and this one imports no spec class, so the two never import each
other: the rules read the fields of the specs they are given (``Model``, ``Plan`` and ``Cluster`` say which).
"""
from __future__ import annotations

from typing import Any

from trainer.contract.schedules import LOOPED_SCHEDULES, MULTI_CHUNK_SCHEDULES, V_SCHEDULES, least_micro_batches
from trainer.contract.stages import is_uneven, layout_problem

Problems = dict[str, list[str]]
Model = Any    # a specs.ModelSpec
Plan = Any     # a specs.ParallelPlan
Cluster = Any  # a specs.ClusterSpec


def add_problem(problems: Problems, key: str, message: str) -> None:
    problems.setdefault(key, []).append(message)


def positive(problems: Problems, obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            add_problem(problems, name, f"{name}={value} must be positive")


# The largest value each number of the contract may take, and why. Beyond them lie only typing mistakes and attacks:
# the bounds keep every estimate and every tune a bounded amount of work, and every count small enough for a 64-bit
# integer after the planner multiplies a few of them together.
_PUBLISHED = "the largest published models stay well below it"
CLUSTERS = "the largest GPU clusters have about 10^5 GPUs"
_RUNS = "a billion steps is centuries of training"
MAX_WORLD = 1_048_576  # ranks in one plan or one cluster (2^20)
LIMITS: dict[str, dict[str, tuple[float, str]]] = {
    "ModelSpec": {
        "n_layers": (1024, f"layers: {_PUBLISHED}; GPT-3 has 96"),
        "d_model": (131_072, f"hidden width: {_PUBLISHED}; GPT-3 has 12,288"),
        "n_heads": (4096, "attention heads"),
        "n_kv_heads": (4096, "key/value heads"),
        "seq_len": (1_048_576, "tokens per sequence, 2^20"),
        "vocab_size": (2_097_152, "tokens in a vocabulary, 2^21; published vocabularies reach 256 K"),
        "ffn_hidden": (1_048_576, "MLP width, 2^20"),
        "n_experts": (4096, "experts per layer"),
        "capacity_factor": (64.0, "an expert taking 64 times its share of tokens is no longer a mixture"),
        "moe_every": (1024, "layers, as many as a model may have"),
        "aux_loss_coef": (1000.0, "a load-balancing weight, usually 0.01"),
        "top_k": (4096, "experts per token, at most n_experts"),
        "norm_eps": (1.0, "a normalisation epsilon, usually 1e-5"),
        "rope_base": (1e12, "a rotary base; Llama 3 uses 500,000"),
        "moe_ffn_hidden": (1_048_576, "expert MLP width, 2^20"),
        "shared_expert_ffn": (1_048_576, "shared expert MLP width, 2^20"),
        "first_dense_layers": (1024, "layers, as many as a model may have"),
    },
    "ParallelPlan": {
        "dp": (1_048_576, CLUSTERS), "tp": (1024, "ranks in one tensor-parallel group"),
        "pp": (1024, "pipeline stages, one layer each at most"), "ep": (1_048_576, CLUSTERS),
        "micro_batch": (65_536, "sequences per micro-batch on one rank"),
        "global_batch": (16_777_216, "sequences per step, 2^24; GPT-3 used 1,600"),
        "virtual_stages": (1024, "model chunks per pipeline rank, one layer each at most"),
        "cp": (1024, "ranks sharing one sequence"),
        "first_stage_layers": (1024, "layers, as many as a model may have"),
        "last_stage_layers": (1024, "layers, as many as a model may have"),
    },
    "GPUSpec": {
        "memory_gb": (100_000.0, "GB on one device"), "peak_tflops": (1_000_000.0, "TFLOP/s on one device"),
        "memory_bandwidth_gbs": (1_000_000.0, "GB/s on one device"),
    },
    "ClusterSpec": {
        "nodes": (131_072, CLUSTERS), "gpus_per_node": (1024, "devices in one node"),
        "intra_node_bandwidth_gbs": (1_000_000.0, "GB/s per device"),
        "inter_node_bandwidth_gbs": (1_000_000.0, "GB/s per device"),
        "gpu_hour_cost": (1_000_000.0, "currency units per GPU-hour"),
    },
    "DatasetSpec": {"tokenizer_vocab": (2_097_152, "tokens in a vocabulary, 2^21")},
    "OptimizerSpec": {
        "lr": (10.0, "a learning rate; GPT training uses about 10^-4"), "min_lr": (10.0, "a learning rate"),
        "weight_decay": (100.0, "a decay weight, usually 0.1"), "eps": (1.0, "Adam's epsilon, usually 10^-8"),
        "grad_clip": (1e9, "a gradient norm"), "warmup_steps": (1_000_000_000, _RUNS),
    },
    "ProfileSpec": {
        "start_step": (1_000_000_000, _RUNS), "warmup": (1_000_000_000, _RUNS),
        "steps": (1000, "profiled steps; each writes a trace of tens of MB"),
    },
    "RunSpec": {
        "steps": (1_000_000_000, _RUNS), "checkpoint_every": (1_000_000_000, _RUNS),
        "eval_every": (1_000_000_000, _RUNS), "log_every": (1_000_000_000, _RUNS),
        "keep_checkpoints": (10_000, "checkpoints kept on disk"), "eval_batches": (1_000_000, "batches per evaluation"),
        "seed": (2 ** 63 - 1, "a 64-bit seed"),
        "dataset_weight": (1e9, "a blend weight; a source's share is its weight over their sum"),
        "spike_factor": (1e6, "a loss that many times the recent median is a spike"),
        "spike_window": (1_000_000, "steps a loss is judged against"),
        "straggler_factor": (1e6, "a rank that many times slower than the others is a straggler"),
        "straggler_window": (1_000_000, "steps a rank's compute time is judged over"),
    },
    "BlendSource": {"weight": (1e9, "a blend weight; a source's share is its weight over their sum")},
}


def within_limits(problems: Problems, spec: Any) -> None:
    """Refuse numbers above their limit (``LIMITS``), naming the limit and why it is there."""
    for name, (limit, why) in LIMITS.get(type(spec).__name__, {}).items():
        value = getattr(spec, name)
        if value > limit:
            shown = f"{value:.3g}" if isinstance(value, float) or value > 10 ** 15 else f"{value:,}"
            add_problem(problems, name, f"{name}={shown} is above the limit of {limit:,.10g} ({why})")


def within_world_limit(problems: Problems, key: str, what: str, size: int) -> None:
    if size > MAX_WORLD:
        add_problem(problems, key, f"{what}={size:,} is above the limit of {MAX_WORLD:,} ({CLUSTERS})")


def plan_alone_problems(plan: Plan) -> Problems:
    """How ``plan`` fails on its own (``ParallelPlan.problems()``): degrees positive and within their limits, the
    global batch divisible by micro-batch × dp, ep dividing dp, the schedule and its virtual stages consistent, then
    what the schedule needs of the micro-batches and what the engine refuses."""
    p: Problems = {}
    within_limits(p, plan)
    positive(p, plan, "dp", "tp", "pp", "micro_batch", "global_batch", "ep", "virtual_stages", "cp")
    for name in ("first_stage_layers", "last_stage_layers"):
        if getattr(plan, name) < 0:
            add_problem(p, name, f"{name}={getattr(plan, name)} must not be negative")
    if len(plan.stage_layers) > 1024 * 1024 or any(not 1 <= n <= 1024 for n in plan.stage_layers):
        add_problem(p, "stage_layers", f"stage_layers must give 1 to 1,024 layers for each stage, got "
                                       f"{list(plan.stage_layers)[:8]}{' …' if len(plan.stage_layers) > 8 else ''}")
    if p:
        return p
    within_world_limit(p, "", "dp×cp×tp×pp ranks", plan.world_size)
    if is_uneven(plan) and plan.pp == 1:
        add_problem(p, "stage_layers", "stage layouts cut a pipeline: they need pp > 1")
    if plan.stage_layers and (plan.first_stage_layers or plan.last_stage_layers):
        add_problem(p, "stage_layers", "give stage_layers, or first_stage_layers / last_stage_layers, not both")
    if plan.global_batch % (plan.micro_batch * plan.dp):
        add_problem(p, "global_batch", f"global_batch={plan.global_batch} is not divisible by "
                                       f"micro_batch×dp={plan.micro_batch}×{plan.dp}={plan.micro_batch * plan.dp}")
    if plan.sequence_parallel and plan.tp == 1:
        add_problem(p, "sequence_parallel", "sequence parallel splits activations over the tensor-parallel group: "
                                            "it needs tp > 1, got tp=1")
    if plan.dp % plan.ep:
        add_problem(p, "ep", f"ep={plan.ep} does not divide dp={plan.dp} (experts are spread over data-parallel ranks)")
    if plan.zero_stage not in (0, 1, 2, 3):
        add_problem(p, "zero_stage", f"zero_stage={plan.zero_stage} must be 0, 1, 2 or 3")
    if plan.virtual_stages > 1 and plan.pipeline_schedule not in MULTI_CHUNK_SCHEDULES:
        add_problem(p, "virtual_stages", f"virtual_stages={plan.virtual_stages} needs a schedule that runs several "
                                         f"chunks a rank: one of {', '.join(MULTI_CHUNK_SCHEDULES)}")
    elif plan.virtual_stages > 1 and plan.pp == 1:
        add_problem(p, "virtual_stages", f"virtual_stages={plan.virtual_stages} cuts each pipeline rank's layers "
                                         f"into chunks: it needs pp > 1")
    if plan.pipeline_schedule == "interleaved" and plan.pp > 1 and plan.virtual_stages < 2:
        add_problem(p, "virtual_stages", "the interleaved schedule needs virtual_stages ≥ 2")
    if plan.pipeline_schedule in V_SCHEDULES and plan.pp > 1 and plan.virtual_stages != 2:
        add_problem(p, "virtual_stages", f"the {plan.pipeline_schedule} schedule places exactly two model chunks "
                                         f"on each pipeline rank, in a V: set virtual_stages=2, got "
                                         f"{plan.virtual_stages}")
    if not p:
        p.update(pipeline_problems(plan))
    p.update(engine_problems(plan))
    return p


def pipeline_problems(plan: Plan) -> Problems:
    """What torch's pipeline schedules need of the number of micro-batches m (the native engine with pp > 1): at
    least ``schedules.least_micro_batches``, and for the looped ones ⌊m/pp⌋ equal rounds. GPipe takes any m, and
    DeepSpeed's pipeline engine schedules any m itself."""
    p: Problems = {}
    m, pp, schedule = plan.grad_accum, plan.pp, plan.pipeline_schedule
    if plan.engine != "native" or pp == 1 or schedule == "gpipe":
        return p
    least = least_micro_batches(schedule, pp)
    if m < least:
        what = f"pp={pp}" if least == pp else f"{least} (for pp={pp})"
        add_problem(p, "global_batch", f"the {schedule} schedule needs at least {what} micro-batches per step, "
                                       f"got m=global_batch/(micro_batch×dp)={m}; raise global_batch, or use "
                                       f"pipeline_schedule='gpipe'")
    elif schedule in LOOPED_SCHEDULES and m % (m // pp):
        add_problem(p, "global_batch", f"the {schedule} schedule runs m={m} micro-batches in ⌊m/pp⌋={m // pp} "
                                       f"equal rounds, so m must be a multiple of {m // pp}; use m a multiple of "
                                       f"pp={pp}")
    return p


def engine_problems(plan: Plan) -> Problems:
    """What each engine cannot do, refused before any work."""
    p: Problems = {}
    if plan.engine == "native":
        if plan.zero_stage in (1, 2):
            add_problem(p, "zero_stage", f"the native engine shards with FSDP2 (zero_stage=3) or not at all (0); "
                                         f"zero_stage={plan.zero_stage} needs engine='deepspeed'")
        if plan.offload_optimizer or plan.offload_params:
            add_problem(p, "offload_optimizer" if plan.offload_optimizer else "offload_params",
                        "CPU offload needs engine='deepspeed'")
    elif plan.engine == "megatron":
        if plan.zero_stage > 1:
            add_problem(p, "zero_stage", f"Megatron-LM shards the optimizer states over data parallel (its "
                                         f"distributed optimizer, zero_stage=1) or nothing (0); got "
                                         f"zero_stage={plan.zero_stage}")
        if plan.offload_optimizer or plan.offload_params:
            add_problem(p, "offload_optimizer" if plan.offload_optimizer else "offload_params",
                        "CPU offload needs engine='deepspeed'")
    else:
        if plan.tp > 1 or plan.sequence_parallel:
            add_problem(p, "tp", f"the deepspeed engine does not do tensor or sequence parallel (tp={plan.tp}); "
                                 f"use engine='native'")
        if plan.cp > 1:
            add_problem(p, "cp", f"the deepspeed engine does not do context parallel (cp={plan.cp}); "
                                 f"use engine='native'")
        if plan.pp > 1 and plan.zero_stage != 1:
            # Stage 2/3 partition gradients that the pipeline engine accumulates over micro-batches; at stage 0 its
            # clipping does not use the global gradient norm (measured: losses drift 2.5e-4 from the native run).
            add_problem(p, "zero_stage", f"DeepSpeed's pipeline engine runs here with ZeRO stage 1 only, got "
                                         f"{plan.zero_stage}")
        if plan.pp > 1 and plan.pipeline_schedule != "1f1b":
            add_problem(p, "pipeline_schedule", f"DeepSpeed's pipeline engine runs its own 1F1B schedule, "
                                                f"not '{plan.pipeline_schedule}'")
        if plan.pp > 1 and is_uneven(plan):
            # PipelineModule cuts its layers itself (partition_method 'uniform', 'parameters' or 'type:…', each a
            # balanced split) and takes no count per stage
            add_problem(p, "stage_layers", "DeepSpeed's pipeline engine balances the layers over its stages itself "
                                           "and takes no layout of its own: leave stage_layers, first_stage_layers "
                                           "and last_stage_layers unset, or use engine='native'")
        if plan.offload_params and plan.zero_stage != 3:
            add_problem(p, "offload_params", f"parameter offload needs zero_stage=3, got {plan.zero_stage}")
        if plan.offload_optimizer and plan.zero_stage == 0:
            add_problem(p, "offload_optimizer", "optimizer offload needs zero_stage ≥ 1")
    if plan.precision == "fp16" and plan.engine == "native" and plan.zero_stage == 3:
        add_problem(p, "precision", "fp16 loss scaling with FSDP2 is not supported; use bf16 or fp32")
    return p


def device_problems(plan: Plan, cluster: Cluster) -> Problems:
    """What the cluster's devices cannot do. CPU ranks: DeepSpeed's CPU accelerator has no fp16 (it refuses it at
    initialisation); torch's own fp16 autocast on the CPU works."""
    p: Problems = {}
    if cluster.gpu.name == "cpu" and plan.engine == "deepspeed" and plan.precision == "fp16":
        add_problem(p, "precision", "DeepSpeed on CPU ranks has no fp16; use bf16 or fp32, or engine='native'")
    return p


def check_plan(model: Model, plan: Plan, cluster: Cluster | None = None) -> Problems:
    """How ``plan`` does not fit ``model`` (and ``cluster``, if given). Keys are plan fields; empty when it fits."""
    p: Problems = {}
    if plan.tp > 1:
        if model.n_heads % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide n_heads={model.n_heads}")
        if model.kv_heads != model.n_heads and model.kv_heads % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide n_kv_heads={model.kv_heads}")
        if model.ffn % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide ffn_hidden={model.ffn}")
        if model.is_moe and model.moe_ffn % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide moe_ffn_hidden={model.moe_ffn}")
        if model.is_moe and model.shared_expert_ffn % plan.tp:
            add_problem(p, "tp", f"tp={plan.tp} does not divide shared_expert_ffn={model.shared_expert_ffn}")
    if plan.sequence_parallel and (model.seq_len // plan.cp) % plan.tp:
        share = f"seq_len={model.seq_len}" if plan.cp == 1 else \
            f"the {model.seq_len // plan.cp} positions of a rank's share (cp={plan.cp}) of seq_len={model.seq_len}"
        add_problem(p, "sequence_parallel", f"tp={plan.tp} does not divide {share}")
    if plan.cp > 1 and model.seq_len % (2 * plan.cp):
        add_problem(p, "cp", f"cp={plan.cp} cuts each sequence into 2·cp={2 * plan.cp} equal chunks (two a rank, "
                             f"to balance the causal mask): 2·cp does not divide seq_len={model.seq_len}")
    if plan.cp > 1 and model.dropout > 0:
        add_problem(p, "cp", f"context parallel (cp={plan.cp}) computes attention as a ring of blocks, with no "
                             f"dropout mask shared between them: set dropout=0 (got {model.dropout}) or cp=1")
    if plan.cp > 1 and model.is_moe:
        add_problem(p, "cp", f"mixture-of-experts layers are not run under context parallel here (cp={plan.cp}): "
                             f"their capacity and balance loss would count a rank's share of each sequence, not the "
                             f"whole; use cp=1")
    if plan.pp > 1:
        problem = layout_problem(model.n_layers, plan)
        if problem:
            add_problem(p, "stage_layers" if is_uneven(plan) else "pp", problem)
    if plan.ep > 1 and not model.is_moe:
        add_problem(p, "ep", f"ep={plan.ep} needs a mixture-of-experts model; this one is dense")
    if model.is_moe and plan.ep > 1 and model.n_experts % plan.ep:
        add_problem(p, "ep", f"ep={plan.ep} does not divide n_experts={model.n_experts}")
    if model.is_moe and plan.engine == "deepspeed" and model.renormalizes_topk != (model.top_k > 1):
        weights = "renormalised over the chosen experts" if model.renormalizes_topk else "the router's probabilities"
        add_problem(p, "engine", f"DeepSpeed's gate weighs the chosen experts by their renormalised probabilities "
                                 f"exactly when top_k > 1; this model (top_k={model.top_k}, topk_norm="
                                 f"'{model.topk_norm}') weighs them by {weights}: use engine='native'")
    if model.is_moe and plan.engine == "deepspeed" and plan.zero_stage == 3:
        add_problem(p, "zero_stage", "DeepSpeed's mixture of experts does not support ZeRO stage 3; "
                                     "use zero_stage ≤ 2")
    if model.is_moe and plan.pp > 1 and plan.engine == "deepspeed":
        add_problem(p, "pp", "DeepSpeed's pipeline engine does not run mixture-of-experts layers here; use pp=1, or "
                             "engine='native'")
    if model.is_moe and plan.engine == "native" and plan.zero_stage == 3 and plan.ep > 1:
        add_problem(p, "zero_stage", f"FSDP2 (zero_stage=3) would shard each expert over data-parallel ranks that "
                                     f"hold different experts under ep={plan.ep}; use ep=1 with FSDP2, or "
                                     f"zero_stage=0, or engine='deepspeed' with zero_stage ≤ 2")
    if cluster is not None and plan.world_size != cluster.world_size:
        add_problem(p, "", f"dp×cp×tp×pp={plan.dp}×{plan.cp}×{plan.tp}×{plan.pp}={plan.world_size} but the "
                           f"cluster has {cluster.world_size} GPUs ({cluster.nodes} node(s) × {cluster.gpus_per_node})")
    if cluster is not None:
        for key, messages in device_problems(plan, cluster).items():
            p.setdefault(key, []).extend(messages)
    if cluster is not None and plan.tp > cluster.gpus_per_node:
        add_problem(p, "tp", f"tp={plan.tp} spans nodes: keep it within gpus_per_node={cluster.gpus_per_node}")
    return p
