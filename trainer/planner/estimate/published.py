"""Published training runs with their exact configurations: what ``bench.trainer.planner.published`` holds the planner against.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC21),
Table 1: GPT models from 1.7 B to 1 T parameters on Selene (DGX A100 80 GB nodes of 8 GPUs, NVLink/NVSwitch inside a
node, eight 200 Gb/s HDR InfiniBand adapters per node: 25 GB/s a GPU), sequence length 2048, vocabulary 51,200,
mixed precision, full activation recompute of every layer. Micro-batch sizes, interleaving and the data-parallel
wrapper are those of the paper's artifact (``examples/sc21/run_table_1.sh`` in NVIDIA/Megatron-LM). The table gives
achieved teraFLOP/s per GPU counted by the paper's eq. 3 (with recompute); the step time is those FLOPs over that
rate and the GPUs.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Tables 3 and 5: 22 B, 175 B,
530 B and 1 T on the same machine, tensor parallel 8, no data parallelism (one run of the 530 B model with 8-way
data parallelism is given in §6.3), the interleaved schedule with three chunks for 175 B and 530 B, measured end to
end with full recompute and with sequence parallelism and selective recompute (the paper's method, which overlaps
the backward tensor-parallel all-reduce with the weight-gradient GEMMs). Step times are the table's.

The runs used Megatron's fused attention softmax over materialised scores, not flash attention, and dropout 0.1.
Each ran, so each fit in its GPUs' 80 GB. Korthikanti's Figure 1 also shows what did not fit: each Table 5 model
with tensor parallelism alone and no recompute (its baseline) needs more than an A100's 80 GB; those plans are here
as memory-only runs (no step time), which the planner must not call fitting.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan
from trainer.contract.presets import cluster
from trainer.planner.estimate.flops import narayanan_flops_per_step
from trainer.planner.estimate.options import EstimateOptions

SELENE_INTER_NODE_GBS = 25.0   # 8 × 200 Gb/s HDR adapters per node of 8 GPUs


@dataclass(frozen=True)
class PublishedRun:
    """One published run: the model, plan and cluster it ran, the step time it reported and where."""

    name: str
    source: str
    model: ModelSpec
    plan: ParallelPlan
    cluster: ClusterSpec
    step_s: float | None     # None: the source gives memory only
    options: EstimateOptions
    fit: bool = True


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name=name, n_layers=layers, d_model=hidden, n_heads=heads, seq_len=2048, vocab_size=51200,
                     dropout=0.1)


def _selene(gpus: int) -> ClusterSpec:
    return cluster("A100-SXM-80GB", nodes=max(1, gpus // 8), gpus_per_node=min(8, gpus),
                   inter_node_bandwidth_gbs=SELENE_INTER_NODE_GBS, name=f"Selene, {gpus} A100 80 GB")


# Megatron-LM as the papers ran it (the plans say engine="megatron"): materialised attention, and in 2021 its
# gradient accumulation added every micro-batch's 16-bit weight gradients into fp32 main-gradient buffers (read
# 2 + 4, write 4 bytes a parameter); by 2022 the weight-gradient GEMM accumulated into them itself (the engine's
# default), and the backward tensor-parallel all-reduce overlapped the weight-gradient GEMM
MEGATRON_2021 = EstimateOptions(attention="math", grad_accumulation_bytes=10)
MEGATRON_2022 = EstimateOptions(attention="math", tp_overlap=True)

# name, heads, hidden, layers, tp, pp, GPUs, global batch, micro-batch, layers per virtual stage (0: no
# interleaving), achieved teraFLOP/s per GPU
_TABLE_1 = (
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 0, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 0, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 0, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 0, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 0, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 5, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 5, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 3, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 1, 163),
    ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 0, 163),
)

# name, heads, hidden, layers, pp, GPUs, global batch, micro-batch, chunks, step with full recompute, step with
# sequence parallel and selective recompute
_TABLE_5 = (
    ("22B", 64, 6144, 48, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 64, 512, 512, 1, 1, 94.42, 71.49),
)


def _narayanan() -> list[PublishedRun]:
    out = []
    for name, heads, hidden, layers, tp, pp, gpus, batch, micro, per_chunk, tflops in _TABLE_1:
        model = _gpt(name, layers, hidden, heads)
        chunks = layers // pp // per_chunk if per_chunk else 1
        plan = ParallelPlan(dp=gpus // (tp * pp), tp=tp, pp=pp, micro_batch=micro, global_batch=batch,
                            engine="megatron", activation_checkpointing="full", precision="bf16",
                            pipeline_schedule="interleaved" if chunks > 1 else "1f1b", virtual_stages=chunks)
        step = narayanan_flops_per_step(model, batch, full_recompute=True) / (tflops * 1e12 * gpus)
        out.append(PublishedRun(f"Megatron {name}", "Narayanan et al. 2021, Table 1", model, plan, _selene(gpus),
                                step, MEGATRON_2021))
    return out


def _korthikanti() -> list[PublishedRun]:
    out = []
    for name, heads, hidden, layers, pp, gpus, batch, micro, chunks, full_s, present_s in _TABLE_5:
        model = _gpt(name, layers, hidden, heads)
        schedule = dict(pipeline_schedule="interleaved" if chunks > 1 else "1f1b", virtual_stages=chunks)
        base = ParallelPlan(tp=8, pp=pp, micro_batch=micro, global_batch=batch, engine="megatron", precision="bf16",
                            **schedule)
        out.append(PublishedRun(f"{name}, full recompute", "Korthikanti et al. 2022, Table 5", model,
                                base.replace(activation_checkpointing="full"), _selene(gpus), full_s, MEGATRON_2022))
        out.append(PublishedRun(f"{name}, sp + selective", "Korthikanti et al. 2022, Table 5", model,
                                base.replace(sequence_parallel=True, activation_checkpointing="selective"),
                                _selene(gpus), present_s, MEGATRON_2022))
        out.append(PublishedRun(f"{name}, no recompute", "Korthikanti et al. 2022, Figure 1", model, base,
                                _selene(gpus), None, MEGATRON_2022, fit=False))
    model = _gpt("530B", 105, 20480, 128)
    plan = ParallelPlan(dp=8, tp=8, pp=35, micro_batch=1, global_batch=2240, engine="megatron", precision="bf16",
                        sequence_parallel=True,
                        activation_checkpointing="selective", pipeline_schedule="interleaved", virtual_stages=3)
    out.append(PublishedRun("530B, sp + selective, dp 8", "Korthikanti et al. 2022, §6.3", model, plan, _selene(2240),
                            39.15, MEGATRON_2022))
    return out


def published_runs() -> list[PublishedRun]:
    """Every run of both papers, in their order."""
    return _narayanan() + _korthikanti()
