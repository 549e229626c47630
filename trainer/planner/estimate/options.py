"""The planner's assumptions that are not part of the model, plan or cluster; calibration fits some of them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from trainer.contract import SpecError

AttentionKernel = Literal["fused", "math"]
ComputeModel = Literal["kernels", "efficiency"]


@dataclass(frozen=True)
class EstimateOptions:
    """Knobs of the estimate, with defaults that say why.

    attention: "fused" (scaled_dot_product_attention / flash: saves its output and a log-sum-exp, no a·s² scores) or
        "math" (materialised scores: the 5·a·s/h term of Korthikanti Table 2).
    small_terms: count the tensors Korthikanti leaves out (LayerNorm mean and 1/σ, log-sum-exp, causal mask,
        token/position/target index tensors). Off reproduces docs/formulas.md's table exactly.
    compute_model: "kernels" costs a GPU's compute kernel by kernel from the layer's shapes and the GPU's measured
        rates (``kernel_time``; GPUs of ``gpu_kernels`` only); "efficiency" divides the hardware FLOPs by peak ·
        compute_efficiency · w/(w + w½), the model a calibration fits (and the one the CPU device always uses).
    compute_efficiency: fraction of dense peak a large matmul reaches (Narayanan 2021: 44–52 % on A100), under
        compute_model "efficiency".
    efficiency_half_work: the GEMM shape at which the achieved efficiency is half of ``compute_efficiency``: a
        layer's matmuls are (b·s tokens) × (h/t or f/t columns), and w = b·s·h/t measures them, so efficiency
        = compute_efficiency · w/(w + w½) — small micro-batches and thin tensor-parallel shards do not fill the
        device (each GEMM pays a fixed w½/w share on top of its FLOPs: tiles that do not fill the units, the
        kernel's set-up). 2¹⁸ suits GPUs; ``calibrate`` fits it (CPU cores fill at far smaller shapes).
    comm_efficiency: fraction of the link bandwidth a collective reaches.
    collective_latency_s: α of the α–β model, fixed seconds each collective (each pipeline message) costs on top of
        its bytes/β: launch, synchronisation and the first hop. ~5 µs on GPU clusters (NVLink a few µs, InfiniBand
        5–10 µs per collective); far more through gloo on CPUs (fit it with ``calibrate``).
    tp_call_s, dp_call_s, pp_call_s: fixed host seconds each collective call costs by kind, on top of α per ring
        step: a tensor-parallel all-reduce (or sp all-gather / reduce-scatter) through DTensor, a data-parallel
        collective (an FSDP2 all-gather / reduce-scatter with its hooks, a DDP bucket), a pipeline send/receive.
        Negligible on GPUs (kernels are queued ahead of the host); milliseconds through gloo on oversubscribed
        CPUs, where the Python dispatch of each call is the cost. 0 by default; ``calibrate`` fits them.
    layer_overhead_s: host seconds each layer costs per micro-batch, forward and backward (Python and autograd
        dispatch, operator launches), whatever its size; a full recompute adds half again (a second forward).
        What dominates tiny models on CPUs; 0 by default (hidden behind the device's queue on GPUs).
    microbatch_overhead_s: host seconds each micro-batch costs outside the layers (embedding, head, loss, the
        schedule's bookkeeping); 0 by default.
    expert_overhead_s: host seconds each expert a rank holds costs per MoE layer and micro-batch, forward and
        backward: the layer runs its experts one after another (``trainer.model.moe.Experts``), each a separate
        small-GEMM call on its capacity rows (T·k·c/E of them) with its own dispatch and autograd nodes. Under the
        planner's shape model a GEMM's cost beyond its FLOPs is w½/w of its FLOP time, a fixed cost per call for
        given widths, so this term also carries the experts' small-GEMM penalty (the compute term keeps the
        model's one w = b·s·h/t). 0 by default (GPU kernels queue ahead of the host); ``calibrate`` fits it from
        runs with experts.
    The host terms are work of a micro-batch, so a pipeline's bubble stretches them as it stretches compute.
    dp_overlap: fraction of data-parallel gradient communication hidden behind the backward pass.
    tp_overlap: the all-reduce of a column-parallel layer's input gradient runs while the layer computes its weight
        gradient (Megatron-LM's asynchronous tensor-parallel all-reduce): the two backward all-reduces of a layer
        cost only what outlasts its weight-gradient GEMMs. Off by default: the native trainer issues them in
        order. Needs compute_model "kernels", which knows the weight-gradient time.
    grad_accumulation_bytes: bytes per parameter each micro-batch's backward streams through HBM to fold its weight
        gradients into the step's (compute_model "kernels"). None: the engine's own (under autocast the cast of each
        16-bit weight gradient to fp32, and from the second micro-batch on an add that reads two and writes one).
        Megatron-LM's engines differ: 10 when every micro-batch's 16-bit gradient is added into an fp32 main-gradient
        buffer, 0 with its gradient-accumulation fusion (the weight-gradient GEMM accumulates in its epilogue).
    step_overhead_s: fixed seconds per step (optimizer launch, host work, synchronisation).
    overhead_bytes: one measured figure for what a GPU holds besides the plan's tensors (calibration fits it). None:
        the named overheads, each a range (``memory.fixed_overheads``: the CUDA context, the driver's reserve, NCCL's
        buffers; nothing on the CPU "device").
    fragmentation: the expected fraction of the dynamic part (activations + buffers) lost to allocator
        fragmentation; calibration fits it.
    fragmentation_high: the most of it, which the high end of the memory band counts and "fits" is decided by.
        None: 15 % on GPUs (``memory.FRAGMENTATION_HIGH``), ``fragmentation`` on the CPU (no caching allocator).
    host_memory_bandwidth_gbs: host memory bandwidth one rank's CPU optimizer step gets (offloaded Adam).
    dropout_mask_bytes: bytes per dropout-mask element; None: 1 on GPUs (Korthikanti), the activation dtype on the
        CPU device (PyTorch's CPU dropout multiplies by a noise tensor of the input's dtype).
    sp_gathered: with sequence parallel, autograd keeps the all-gathered (full-sequence) LayerNorm outputs that feed
        the column-parallel projections (PyTorch DTensor, the native trainer); False keeps the 1/t shard (Megatron,
        Korthikanti's table).
    repeat_kv: grouped-query keys/values are repeated to n_heads before attention, so autograd saves 3·h per token
        for q, k, v (the native trainer does; selective recompute keeps h + 2·kv instead); False saves
        h + 2·n_kv_heads·head_dim (kernels with native GQA).
    pcie_bandwidth_gbs: host link used by CPU offload.
    loss_bytes: bytes per element of the logits the loss works on (fp32, as autocast and Megatron do).
    """

    attention: AttentionKernel = "fused"
    small_terms: bool = True
    compute_model: ComputeModel = "kernels"
    compute_efficiency: float = 0.5
    efficiency_half_work: float = 2.0 ** 18
    comm_efficiency: float = 0.8
    collective_latency_s: float = 5e-6
    tp_call_s: float = 0.0
    dp_call_s: float = 0.0
    pp_call_s: float = 0.0
    layer_overhead_s: float = 0.0
    microbatch_overhead_s: float = 0.0
    expert_overhead_s: float = 0.0
    dp_overlap: float = 0.0
    tp_overlap: bool = False
    grad_accumulation_bytes: float | None = None
    step_overhead_s: float = 0.0
    overhead_bytes: float | None = None
    fragmentation: float = 0.0
    fragmentation_high: float | None = None
    pcie_bandwidth_gbs: float = 25.0
    host_memory_bandwidth_gbs: float = 10.0
    repeat_kv: bool = True
    dropout_mask_bytes: int | None = None
    sp_gathered: bool = True
    loss_bytes: int = 4

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        if self.attention not in ("fused", "math"):
            p["attention"] = [f"attention={self.attention!r} must be 'fused' or 'math'"]
        if self.compute_model not in ("kernels", "efficiency"):
            p["compute_model"] = [f"compute_model={self.compute_model!r} must be 'kernels' or 'efficiency'"]
        for name in ("compute_efficiency", "comm_efficiency"):
            if not 0.0 < getattr(self, name) <= 1.0:
                p[name] = [f"{name}={getattr(self, name)} must be in (0, 1]"]
        if not 0.0 <= self.dp_overlap <= 1.0:
            p["dp_overlap"] = [f"dp_overlap={self.dp_overlap} must be in [0, 1]"]
        for name in ("efficiency_half_work", "step_overhead_s", "fragmentation", "collective_latency_s",
                     "tp_call_s", "dp_call_s", "pp_call_s", "layer_overhead_s", "microbatch_overhead_s",
                     "expert_overhead_s"):
            if getattr(self, name) < 0:
                p[name] = [f"{name}={getattr(self, name)} must not be negative"]
        if self.grad_accumulation_bytes is not None and self.grad_accumulation_bytes < 0:
            p["grad_accumulation_bytes"] = [f"grad_accumulation_bytes={self.grad_accumulation_bytes} must not be "
                                            "negative"]
        if self.fragmentation_high is not None and self.fragmentation_high < self.fragmentation:
            p["fragmentation_high"] = [f"fragmentation_high={self.fragmentation_high} must not be below "
                                       f"fragmentation={self.fragmentation}"]
        if self.overhead_bytes is not None and self.overhead_bytes < 0:
            p["overhead_bytes"] = [f"overhead_bytes={self.overhead_bytes} must not be negative"]
        for name in ("pcie_bandwidth_gbs", "host_memory_bandwidth_gbs"):
            if getattr(self, name) <= 0:
                p[name] = [f"{name}={getattr(self, name)} must be positive"]
        if self.dropout_mask_bytes is not None and self.dropout_mask_bytes not in (1, 2, 4):
            p["dropout_mask_bytes"] = [f"dropout_mask_bytes={self.dropout_mask_bytes} must be 1, 2, 4 or None"]
        if self.loss_bytes not in (2, 4):
            p["loss_bytes"] = [f"loss_bytes={self.loss_bytes} must be 2 or 4"]
        return p

    def validate(self) -> "EstimateOptions":
        problems = self.problems()
        if problems:
            raise SpecError({f"options.{k}": v for k, v in problems.items()})
        return self

    def replace(self, **changes) -> "EstimateOptions":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "EstimateOptions":
        data = dict(data or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecError.single("options", f"unknown option(s) {unknown}; known: {sorted(names)}")
        return cls(**data).validate()
