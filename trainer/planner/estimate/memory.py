"""Memory per GPU: model states, activations, temporary buffers. Which terms of ``memory_model`` a plan's rank holds
and the numbers each takes (a ``Saved``); ``explain`` prints the same terms' formulas.

Model states (docs/formulas.md, ZeRO §3.1), bytes per parameter (weights + gradients + optimizer):
    DeepSpeed, 16-bit:  2 + 2 + 12  (fp32 master, momentum, variance)
    fp32:               4 + 4 + 8   (AdamW exp_avg, exp_avg_sq); DeepSpeed ZeRO ≥ 1: 4 + 4 + 12 (its own fp32
                                    master partition besides the fp32 weights)
    native, 16-bit:     4 + 4 + 8   (FSDP2 / autocast keep fp32 parameters and gradients; 16-bit copies are
                                     transient, counted under buffers)
ZeRO stage ≥ 1 shards the optimizer over the N_d data-parallel ranks, ≥ 2 the gradients, 3 the weights:
    ZeRO-1 4Ψ + 12Ψ/N_d, ZeRO-2 2Ψ + 14Ψ/N_d, ZeRO-3 16Ψ/N_d (mixed precision).
The native engine's ZeRO-3 is FSDP2, which chunks dimension 0 of each tensor (exact per rank, see params.py);
DeepSpeed partitions a flat buffer (ceil(Ψ/N_d) per rank); MoE experts in their own groups over the N_d/ep ranks
that hold the same experts (``deepspeed_shard``).

Activations of one layer for one micro-batch (Korthikanti et al. 2022, Table 2; docs/formulas.md), T = s·b tokens,
e bytes per activation element, r = t with sequence parallel else 1:
    layernorm inputs   2·T·h·e / r     layernorm outputs  2·T·h·e / r      (the 4 + 4 of the "10")
    dropout masks      2·T·h·1 / r     (the 2 of the "10"; only with dropout)
    qkv                T·(h + 2kv)·e / t   attention output (out-projection input) T·h·e / t
    MLP                2·T·f·e / t     (up output, GELU output: 16 of the "24" with f = 4h)
    attention core     math: T·a·s·e/t (softmax) + with dropout T·a·s·(1 + e)/t (mask, dropped scores)
                       fused: T·a·4/t (log-sum-exp)
With e = 2, f = 4h, kv = h and dropout these give s·b·h·(34 + 5as/h) at t = 1, s·b·h·(10 + 24/t + 5as/(ht)) with tensor
parallel, everything / t with sequence parallel; selective recompute drops the attention core; full recompute keeps the
layer input only (2·s·b·h at e = 2). Small terms Korthikanti leaves out (options.small_terms): LayerNorm mean and 1/σ
(2 × 4 bytes per token per LayerNorm), the log-sum-exp of fused attention, the causal mask of math attention (s² bytes),
index tensors (int64). These constants were checked against what autograd saves in a nanoGPT-style layer
(tests/trainer/planner/test_activations_vs_torch.py). MoE layers replace the MLP terms with ``moe_activations``.

A layer's terms depend on two small values: its ``LayerShape`` (what the model fixes) and the
``ActivationSettings`` (what the plan and the options fix). Both are frozen and hashable, so that the terms of
each distinct pair are computed once however many plans share it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.schedules import V_SCHEDULES, ZERO_BUBBLE
from trainer.planner.estimate import memory_model as MM
from trainer.planner.estimate import step_model
from trainer.planner.estimate.expr import Term

LN_STAT_BYTES = 4   # LayerNorm saves mean and 1/σ in fp32 (in the input's dtype on the CPU)
# Under autocast the fp32 LayerNorm output is cast to 16 bits once per consuming matmul: q, k, v and the MLP's up.
AUTOCAST_LN_CONSUMERS = 4

Terms = tuple[tuple[str, float], ...]   # named byte terms, in the order the layer saves them


@dataclass(frozen=True, slots=True)
class Saved:
    """One named term of a rank's memory: its ``memory_model`` term and the numbers it took (what ``explain``
    prints), and the bytes they give."""

    name: str
    term: Term
    args: tuple
    value: float = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "value", self.term.function(*self.args))


@dataclass(frozen=True, slots=True)
class Held:
    """A term a pipeline stage holds ``count`` times: once per layer of a kind (``per`` names that count in its
    figure), or once a stage (``per`` empty)."""

    saved: Saved
    count: int = 1
    per: str = ""

    @property
    def value(self) -> float:
        return float(self.count * self.saved.value)


def activation_bytes_per_element(precision: str) -> int:
    return 4 if precision == "fp32" else 2


# ---- model states ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter of each model state before sharding."""

    weights: int
    gradients: int
    optimizer: int


DEEPSPEED_16BIT = StateBytes(2, 2, 12)   # 16-bit weights and gradients; fp32 master, momentum, variance
DEEPSPEED_FP32_ZERO = StateBytes(4, 4, 12)
FP32_ADAMW = StateBytes(4, 4, 8)         # fp32 weights and gradients; AdamW exp_avg, exp_avg_sq
# Megatron-LM (its distributed-optimizer guide): 16-bit weights; bf16 training accumulates gradients in an fp32
# main-gradient buffer and keeps an fp32 master, momentum and variance (2 + 4 + 12 = 18); fp16 keeps 16-bit gradients
# and the optimizer an fp32 copy of them besides (2 + 2 + 16 = 20). The distributed optimizer shards the optimizer
# part over data parallel: 6 + 12/d and 4 + 16/d.
MEGATRON = {"bf16": StateBytes(2, 4, 12), "fp16": StateBytes(2, 2, 16), "fp32": FP32_ADAMW}


def state_bytes_per_param(precision: str, engine: str, zero_stage: int = 0) -> StateBytes:
    if engine == "megatron":
        return MEGATRON[precision]
    if precision != "fp32" and engine == "deepspeed":
        return DEEPSPEED_16BIT
    if engine == "deepspeed" and zero_stage >= 1:
        # DeepSpeed's ZeRO optimizers keep their own fp32 master partition (a copy) even when the weights are fp32:
        # measured 12 bytes per sharded parameter at stages 1, 2 and 3 (tests/trainer/planner/test_memory_vs_runs.py)
        return DEEPSPEED_FP32_ZERO
    return FP32_ADAMW


def optimizer_bytes_per_param(precision: str, engine: str, zero_stage: int = 0) -> int:
    """Bytes an AdamW step streams through memory per parameter it updates: the gradient read three times (the
    norm for clipping, the step, and zeroing it after), the weights and optimizer states each read and written."""
    b = state_bytes_per_param(precision, engine, zero_stage)
    return 3 * b.gradients + 2 * (b.weights + b.optimizer)


@dataclass(frozen=True)
class ModelStates:
    """A rank's model states: weights, gradients and optimizer on the GPU, each a term with its numbers, and the
    bytes offload keeps in host memory."""

    saved: dict[str, Saved]
    host: int

    def bytes(self) -> dict[str, float]:
        return {**{name: saved.value for name, saved in self.saved.items()}, "host": self.host}


def model_states(params: int, params_sharded: int, dp: int, zero_stage: int, precision: str, engine: str,
                 offload_optimizer: bool = False, offload_params: bool = False, expert_params: int = 0,
                 ep: int = 1) -> dict[str, int]:
    """Bytes of weights, gradients, optimizer states on one GPU, and what offload keeps in host memory
    (``model_state_terms``'s, by value)."""
    return model_state_terms(params, params_sharded, dp, zero_stage, precision, engine, offload_optimizer,
                             offload_params, expert_params, ep).bytes()


def model_state_terms(params: int, params_sharded: int, dp: int, zero_stage: int, precision: str, engine: str,
                      offload_optimizer: bool = False, offload_params: bool = False, expert_params: int = 0,
                      ep: int = 1, vocabulary: tuple[int, int, int] | None = None) -> ModelStates:
    """Weights, gradients, optimizer states on one GPU as terms of ``memory_model``, and what offload keeps in host
    memory.

    ``params`` are the rank's parameters before data-parallel sharding; ``params_sharded`` after ZeRO-3/FSDP sharding
    (the native engine's exact per-tensor chunks; for DeepSpeed pass ``deepspeed_shard``).
    ``expert_params`` of them are experts: DeepSpeed's ZeRO and Megatron's distributed optimizer partition them
    over the dp/ep ranks that hold the same experts (the expert-data-parallel group), the rest over all dp ranks.
    ``vocabulary``: (V, t, h) of a vocabulary-split embedding whose gradient is a 1/t view of a full V×h one.
    """
    per = state_bytes_per_param(precision, engine, zero_stage)
    flat_shard = deepspeed_shard(params, dp, expert_params, ep)
    shard = params_sharded if (zero_stage >= 3 and engine == "native") else flat_shard

    def state(name: str, whole: Term, sharded: Term, sharded_from_stage: int, bytes_per_param: int) -> Saved:
        if zero_stage >= sharded_from_stage:
            return Saved(name, sharded, (bytes_per_param, shard))
        return Saved(name, whole, (bytes_per_param, params))

    weights = state("weights", MM.WEIGHTS, MM.WEIGHTS_SHARDED, 3, per.weights)
    gradients = state("gradients", MM.GRADIENTS, MM.GRADIENTS_SHARDED, 2, per.gradients)
    if vocabulary is not None and zero_stage < 2:
        gradients = Saved("gradients", MM.GRADIENTS_VOCABULARY_VIEW, (per.gradients, params, *vocabulary))
    optimizer = state("optimizer", MM.OPTIMIZER, MM.OPTIMIZER_SHARDED, 1, per.optimizer)
    host = 0
    if offload_optimizer:
        host += optimizer.value
        optimizer = Saved("optimizer", MM.OFFLOADED, ())
    if offload_params:
        host += weights.value
        weights = Saved("weights", MM.OFFLOADED, ())
    return ModelStates({"weights": weights, "gradients": gradients, "optimizer": optimizer}, host)


def deepspeed_shard(params: int, dp: int, expert_params: int = 0, ep: int = 1) -> int:
    """Parameters of one rank's ZeRO partition: ⌈(P − P_experts)/dp⌉ + ⌈P_experts/(dp/ep)⌉ (DeepSpeed splits the
    MoE parameters into their own groups, reduced and partitioned over the expert-data-parallel ranks)."""
    edp = max(1, dp // max(1, ep))
    return -(-(params - expert_params) // dp) + -(-expert_params // edp)


# ---- what a GPU holds besides the plan's tensors --------------------------------------------------------------
GIB = 2 ** 30


@dataclass(frozen=True, slots=True)
class Band:
    """A figure as a range: the least it can be, what to expect, the most it can be."""

    low: float
    expected: float
    high: float

    @classmethod
    def exact(cls, value: float) -> "Band":
        return cls(value, value, value)

    def __add__(self, other: "Band") -> "Band":
        return Band(self.low + other.low, self.expected + other.expected, self.high + other.high)

    def to_dict(self) -> dict[str, float]:
        return {"low": self.low, "expected": self.expected, "high": self.high}


# Sources in docs/formulas.md, Memory besides the tensors. The CUDA context: the kernels PyTorch 2.1 loads on an
# A100, lazily (0.47 GiB) to eagerly (0.92 GiB). The driver's reserve: an A100 80 GB's 80 GiB (nvidia-smi) against
# the 79.21 GiB cudaMemGetInfo gives a process. NCCL: 1.5 GiB appeared at the first collective of two ranks, 1 to
# 2 GiB as the ranks grow. Fragmentation: the caching allocator lost 15 % of its memory on average across eight
# LLMs trained with recompute, ZeRO, offload or LoRA on A100 80 GB (GMLake, ASPLOS 2024); the plan's states are
# allocated once and stay, so only the dynamic part (activations and transient buffers) fragments.
CUDA_CONTEXT = Band(0.47 * GIB, 0.695 * GIB, 0.92 * GIB)
DRIVER_RESERVE = Band.exact(0.79 * GIB)
NCCL = Band(1.0 * GIB, 1.5 * GIB, 2.0 * GIB)
FRAGMENTATION_HIGH = 0.15


def fixed_overheads(on_gpu: bool, distributed: bool, overhead_bytes: float | None) -> dict[str, Band]:
    """What one GPU holds whatever the batch: the CUDA context, the driver's reserve and, with any collective,
    NCCL's buffers; or one measured figure (``overhead_bytes``, from calibration) instead. Nothing on the CPU."""
    if overhead_bytes is not None:
        return {"overhead": Band.exact(overhead_bytes)} if overhead_bytes else {}
    if not on_gpu:
        return {}
    named = {"cuda_context": CUDA_CONTEXT, "driver_reserve": DRIVER_RESERVE}
    if distributed:
        named["nccl"] = NCCL
    return named


def fragmentation_band(dynamic: float, expected: float, high: float) -> Band:
    """Bytes the allocator loses to fragmentation of the ``dynamic`` part: none at the least, the expected share
    (calibration fits it), the high share at the most."""
    return Band(0.0, MM.FRAGMENTATION(expected, dynamic), MM.FRAGMENTATION(max(expected, high), dynamic))


# ---- activations ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MoEShape:
    n_experts: int            # E
    top_k: int                # k
    capacity_factor: float    # c (0: no token dropped)
    ffn: int = 0              # f_e, one routed expert's width (0: the layer's ffn)
    shared_ffn: int = 0       # f_s, the shared expert's width (0: none)
    shared_gate: bool = False  # the shared expert's output scaled by sigmoid(x·w)
    renormalize: bool | None = None  # the top-k weights renormalised to sum to 1 (None: when k > 1)


@dataclass(frozen=True, slots=True)
class LayerShape:
    """What the model fixes about the tensors one transformer layer saves."""

    d_model: int              # h
    ffn: int                  # f
    kv_dim: int               # kv = n_kv_heads · head_dim
    n_heads: int              # a
    seq_len: int              # s
    head_dim: int = 0         # sizes the rotary tables
    rope: bool = False        # rotary positions
    dropout: bool = False
    moe: MoEShape | None = None  # a mixture-of-experts layer: its experts replace the MLP
    gated: bool = False       # SwiGLU MLPs (gate, up, down) rather than GELU (up, down)
    rmsnorm: bool = False     # RMSNorm (one statistic per token) rather than LayerNorm (two)
    ring: bool = False        # a context-parallel rank's share, its attention run as a ring (``context_share``)

    @classmethod
    def of(cls, model: ModelSpec, moe: bool = False) -> "LayerShape":
        """A dense layer of ``model``, or (``moe``) one of its mixture-of-experts layers."""
        experts = MoEShape(model.n_experts, model.top_k, model.capacity_factor, model.moe_ffn,
                           model.shared_expert_ffn, model.shared_expert_gate, model.renormalizes_topk)
        return cls(model.d_model, model.ffn, model.kv_heads * model.head_dim, model.n_heads, model.seq_len,
                   model.head_dim, model.positions == "rope", model.dropout > 0, experts if moe else None,
                   model.is_gated, model.norm == "rmsnorm")

    @property
    def norm_stats(self) -> int:
        """Statistics a norm saves per token: mean and 1/σ (LayerNorm), 1/rms (RMSNorm)."""
        return 1 if self.rmsnorm else 2

    @property
    def mlp_saved(self) -> int:
        """f-wide tensors one MLP saves per token: up output and GELU output; or for SwiGLU the gate output (SiLU
        reads it), SiLU's output and the up output (their product reads both) and the product (down reads it)."""
        return 4 if self.gated else 2


@dataclass(frozen=True, slots=True)
class ActivationSettings:
    """What the plan and the estimate's options fix about the tensors saved for one micro-batch on one rank.

    ``attention``: "fused" (log-sum-exp only), "math" (materialised scores and a saved causal mask) or "sdpa_math"
    (scaled_dot_product_attention falling back to its math path, as with dropout on the CPU: the scores as "math",
    but no saved mask).
    ``mask_bytes``: bytes per dropout-mask element (1 on GPUs; PyTorch's CPU dropout keeps a mask of the input's
    dtype).
    ``sp_gathered``: with sequence parallel, the all-gathered LayerNorm outputs that feed the column-parallel
    projections are what autograd keeps (PyTorch DTensor does; Megatron keeps the 1/t shard and gathers again in
    backward): 2·T·h·e instead of 2·T·h·e/t.
    ``autocast``: 16-bit autocast over fp32 weights (the native engine without FSDP): the residual stream and so the
    LayerNorm inputs stay fp32, and each matmul reading a LayerNorm output saves its own 16-bit cast of it (3 for
    q, k, v, 1 for the MLP).
    ``stat_bytes``: bytes of each LayerNorm mean and 1/σ element.
    ``repeat_kv``: grouped-query keys and values are repeated to h before the kernel (the native trainer does), so
    the kernel saves h-wide copies — unless selective recompute reruns the kernel, which then keeps only the
    kv-wide projections.
    ``loss_bytes``: bytes per element of the logits the loss works on (the last stage's terms only).
    ``rmsnorm_composite``: RMSNorm runs as separate operations (PyTorch on the CPU: pow, mean, rsqrt, two
    multiplies), which save the fp32 normalised x/rms before the gain and the input upcast to fp32; the fused kernel
    (CUDA) saves the input and 1/rms only.
    """

    micro_batch: int          # b
    tp: int                   # t
    sequence_parallel: bool
    checkpointing: str        # "none", "selective", "full"
    bytes_per_element: int    # e
    attention: str
    small_terms: bool         # the tensors Korthikanti leaves out
    mask_bytes: int = 1
    sp_gathered: bool = False
    autocast: bool = False
    stat_bytes: int = LN_STAT_BYTES
    repeat_kv: bool = False
    loss_bytes: int = 4
    rmsnorm_composite: bool = False

    @property
    def sp_split(self) -> int:
        """r: what sequence parallel divides the LayerNorm and dropout terms by."""
        return self.tp if self.sequence_parallel else 1

    @property
    def stream_bytes(self) -> int:
        """Bytes per element of the residual stream: fp32 under autocast."""
        return 4 if self.autocast else self.bytes_per_element

    @property
    def ln_output_copies(self) -> int:
        """Saved copies of each LayerNorm output: its 16-bit cast per consuming matmul under autocast, else 2 (the
        two LayerNorms of a layer)."""
        return AUTOCAST_LN_CONSUMERS if self.autocast else 2

    @property
    def ln_output_split(self) -> int:
        """What the saved LayerNorm outputs are divided by: 1 when sequence parallel keeps them gathered."""
        return 1 if self.sp_gathered else self.sp_split

    @property
    def rotary_table_bytes(self) -> float:
        """Bytes per element of the saved cos/sin tables: fp32 under autocast, else the activation dtype."""
        return 4.0 if self.autocast else self.bytes_per_element

    def kv_saved(self, d_model: int, kv_dim: int) -> int:
        """Width of the saved keys and values: repeated to h before the kernel, unless selective recompute reruns
        the kernel and keeps the kv-wide projections only."""
        return d_model if (self.repeat_kv and self.checkpointing != "selective") else kv_dim

    def norm_terms(self, tokens: int, d_model: int, rmsnorm: bool, norms: int, prefix: str) -> list[Saved]:
        """What ``norms`` norms save besides their input and output: the statistics (small terms), and for a
        composite RMSNorm its fp32 x/rms (and the fp32 upcast of a 16-bit input, which replaces the input)."""
        r, terms = self.sp_split, []
        if rmsnorm:
            if self.small_terms:
                terms.append(Saved(f"{prefix}rmsnorm_stats", MM.RMSNORM_STATS, (norms, tokens, r)))
            if self.rmsnorm_composite:
                terms.append(Saved(f"{prefix}rmsnorm_normalized", MM.RMSNORM_NORMALIZED, (norms, tokens, d_model, r)))
        elif self.small_terms:
            terms.append(Saved(f"{prefix}layernorm_stats", MM.LAYERNORM_STATS, (norms, tokens, self.stat_bytes, r)))
        return terms

    def norm_input_bytes(self, rmsnorm: bool) -> int:
        """Bytes per element of a saved norm input: the residual stream's, or fp32 for a composite RMSNorm, which
        saves its input upcast to fp32."""
        return 4 if (rmsnorm and self.rmsnorm_composite) else self.stream_bytes


@lru_cache(maxsize=256)
def context_share(shape: LayerShape, cp: int) -> LayerShape:
    """A layer as one context-parallel rank holds it: s/cp positions of each sequence (docs/formulas.md, Context
    parallel). Every term ∝ T = s·b then shrinks cp times; ring attention keeps only its block's output and
    log-sum-exp, never a score matrix across ranks, and its keys and values as they travel, before any repeat to
    the query heads; the rotary tables it saves are its positions' rows, gathered once for q and once for k."""
    return shape if cp == 1 else replace(shape, seq_len=shape.seq_len // cp, ring=True)


@lru_cache(maxsize=8192)
def layer_activations(shape: LayerShape, settings: ActivationSettings) -> Terms:
    """Named byte terms one transformer layer saves for backward for one micro-batch on one tensor-parallel rank
    (``layer_saved``'s, by value)."""
    return tuple((saved.name, saved.value) for saved in layer_saved(shape, settings))


@lru_cache(maxsize=8192)
def layer_saved(shape: LayerShape, settings: ActivationSettings) -> tuple[Saved, ...]:
    """What one transformer layer saves for backward for one micro-batch on one tensor-parallel rank, each a term of
    ``memory_model`` with the numbers it takes.

    An MoE layer (``shape.moe``) replaces the MLP terms with ``moe_activations``. Rotary positions save one extra
    T·h·e and the cos/sin tables (measured), none of which selective recompute keeps.
    """
    h, f, kv, a, s = shape.d_model, shape.ffn, shape.kv_dim, shape.n_heads, shape.seq_len
    t, e = settings.tp, settings.bytes_per_element
    T = s * settings.micro_batch
    r = settings.sp_split
    if settings.checkpointing == "full":
        return (Saved("layer_input", MM.LAYER_INPUT, (T, h, settings.stream_bytes, r)),)
    small, mask_bytes, r_ln = settings.small_terms, settings.mask_bytes, settings.ln_output_split
    terms = [Saved("layernorm_inputs", MM.LAYERNORM_INPUTS, (T, h, settings.norm_input_bytes(shape.rmsnorm), r)),
             Saved("layernorm_outputs", MM.LAYERNORM_OUTPUTS, (settings.ln_output_copies, T, h, e, r_ln))]
    if settings.autocast and shape.gated and not shape.moe:
        # under autocast SwiGLU's gate casts the norm output once more, beside up's cast
        terms.append(Saved("gate_input_cast", MM.GATE_INPUT_CAST, (T, h, e, r_ln)))
    terms += settings.norm_terms(T, h, shape.rmsnorm, 2, "")
    if shape.dropout:
        terms.append(Saved("dropout_masks", MM.DROPOUT_MASKS, (T, h, mask_bytes, r)))
    selective = settings.checkpointing == "selective"
    kv_saved = kv if shape.ring else settings.kv_saved(h, kv)
    terms += [Saved("qkv", MM.QKV, (T, h, kv_saved, e, t)),
              Saved("attention_output", MM.ATTENTION_OUTPUT, (T, h, e, t))]
    if shape.rope and not selective:
        # rotated copies of q and k replace the projections, and one more h-sized tensor of the rotation is kept
        terms.append(Saved("rotary", MM.ROTARY, (T, h, e, t)))
        if small:  # fp32 cos/sin buffers; a model running in 16 bits saves 16-bit casts of them
            gathers = 2 if shape.ring else 1  # a cp share gathers its rows apart for q and for k
            terms.append(Saved("rotary_tables", MM.ROTARY_TABLES,
                               (gathers, s, shape.head_dim, settings.rotary_table_bytes)))
    if not selective:
        if settings.attention in ("math", "sdpa_math"):
            terms.append(Saved("attention_scores", MM.ATTENTION_SCORES, (T, a, s, e, t)))
            if shape.dropout:
                terms.append(Saved("attention_dropout", MM.ATTENTION_DROPOUT, (T, a, s, mask_bytes, e, t)))
            if small and settings.attention == "math":
                terms.append(Saved("causal_mask", MM.CAUSAL_MASK, (s,)))
        elif small:
            terms.append(Saved("attention_logsumexp", MM.ATTENTION_LOGSUMEXP, (T, a, t)))
    if shape.moe:
        terms += moe_activations(T, shape, settings)
    elif shape.gated:
        terms.append(Saved("swiglu", MM.SWIGLU, (T, f, e, t)))
    else:
        terms.append(Saved("mlp", MM.MLP, (T, f, e, t)))
    return tuple(terms)


def expert_capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert for one micro-batch of ``tokens`` on one rank, as the trainer's MoE layer sizes them:
    cap = max(1, ⌈capacity_factor · tokens · k / E⌉), or every token (T) when capacity_factor is 0 (drop none)."""
    if capacity_factor == 0:
        return max(1, tokens)
    return max(1, math.ceil(capacity_factor * tokens * top_k / n_experts))


def routed_capacity_factor(model: ModelSpec) -> float:
    """The capacity factor the dispatch buffer is sized by: the model's, or E/k when it is 0 (no token dropped: the
    trainer gives every expert T slots, E·T = (E/k)·T·k in all), so that E·cap ≈ c·T·k either way."""
    return model.capacity_factor or model.n_experts / model.top_k


def moe_kept(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Kept (token, choice) assignments M at most: min(T·k, E·min(cap, T)). Exact when capacity_factor ≥ E/k (no
    expert can overflow); below that the drops depend on the routing, and this bound (every expert full) is what a
    peak estimate needs."""
    cap = expert_capacity(tokens, n_experts, top_k, capacity_factor)
    return min(tokens * top_k, n_experts * min(cap, tokens))


def moe_activations(tokens: int, shape: LayerShape, settings: ActivationSettings) -> list[Saved]:
    """What one MoE layer of the trainer saves besides its attention half, for T = ``tokens`` on one rank (measured
    with saved-tensor hooks; tests/trainer/planner/test_activations_vs_torch.py). E experts, k = top_k, cap slots per
    expert, M kept assignments (``moe_kept``); e bytes per activation element.

        router_probs        T·E·4          softmax output, fp32 (the router's input is the LayerNorm output, counted)
        dispatched_tokens   M·h·e_s        tokens[rows]: index_copy keeps its source for backward; e_s is the
                                           LayerNorm output's dtype (fp32 under autocast, ``stream_bytes``)
        expert_inputs       E·cap·h·e      the (E, cap, h) dispatch buffer, empty slots included (under expert
                                           parallel, the received buffer of E/ep experts × ep·cap rows: same size;
                                           under autocast each expert's 16-bit cast of its rows)
        expert_mlp          2·E·cap·f·e    each expert's up-projection and GELU outputs on its cap rows
        combine             2·M·h·e        expert outputs gathered back per assignment (out[slots], kept by the gate
                                           multiply) and the gated outputs (index_add keeps its source)
    small terms: top-k indices T·k·8; kept mask T·k·1; row and slot indices 2·M·8; gates M·e (cast to the
    activation dtype before the multiply); with k > 1 the renormalisation keeps top-p T·k·4 and its sum T·4;
    the aux loss keeps the first-choice fractions E·4.
    Expert parallel does not change these per-rank sizes: every rank dispatches its own T tokens into E·cap
    slots, and each of its E/ep experts runs on ep·cap received rows. Tensor parallel is refused for MoE models.
    """
    moe = shape.moe
    T, h, f, e = tokens, shape.d_model, moe.ffn or shape.ffn, settings.bytes_per_element
    E, k, c = moe.n_experts, moe.top_k, moe.capacity_factor
    cap = expert_capacity(T, E, k, c)
    M = moe_kept(T, E, k, c)
    terms = [Saved("router_probs", MM.ROUTER_PROBS, (T, E)),
             Saved("dispatched_tokens", MM.DISPATCHED_TOKENS, (M, h, settings.stream_bytes)),
             Saved("expert_inputs", MM.EXPERT_INPUTS, (E, cap, h, e))]
    if shape.gated:
        if settings.autocast:  # each expert's gate casts its rows too
            terms.append(Saved("expert_gate_inputs", MM.EXPERT_GATE_INPUTS, (E, cap, h, e)))
        terms.append(Saved("expert_swiglu", MM.EXPERT_SWIGLU, (E, cap, f, e)))
    else:
        terms.append(Saved("expert_mlp", MM.EXPERT_MLP, (E, cap, f, e)))
    terms.append(Saved("combine", MM.COMBINE, (M, h, e)))
    if moe.shared_ffn:
        terms += shared_expert_activations(T, shape, settings)
    if settings.small_terms:
        renormalized = moe.renormalize or (moe.renormalize is None and k > 1)
        terms.append(Saved("routing_small", MM.ROUTING_SMALL_RENORMALIZED if renormalized else MM.ROUTING_SMALL,
                           (T, k, M, e, E)))
    return terms


def shared_expert_activations(tokens: int, shape: LayerShape, settings: ActivationSettings) -> list[Saved]:
    """The shared expert of an MoE layer (Qwen2-MoE): an MLP of width f_s on all T tokens, its input the norm output
    (counted with the norms; under autocast each of its input matmuls saves its own 16-bit cast), and with a gate
    sigmoid(x·w) the expert's output (kept by the gate multiply), the gate input's cast and the sigmoid output."""
    moe, T, h, e = shape.moe, tokens, shape.d_model, settings.bytes_per_element
    terms = [Saved("shared_expert", MM.SHARED_EXPERT, (shape.mlp_saved, T, moe.shared_ffn, e))]
    casts = (2 if shape.gated else 1) + (1 if moe.shared_gate else 0)
    if settings.autocast:
        terms.append(Saved("shared_expert_input_casts", MM.SHARED_EXPERT_INPUT_CASTS, (casts, T, h, e)))
    if moe.shared_gate:
        terms.append(Saved("shared_expert_output", MM.SHARED_EXPERT_OUTPUT, (T, h, e)))
        if settings.small_terms:
            terms.append(Saved("shared_gate_small", MM.SHARED_GATE_SMALL, (T, e)))
    return terms


@lru_cache(maxsize=8192)
def edge_activations(model: ModelSpec, settings: ActivationSettings, first: bool, last: bool) -> Terms:
    """What the embedding (first stage) and the final LayerNorm + head + loss (last stage) save per micro-batch
    (``edge_saved``'s, by value)."""
    return tuple((saved.name, saved.value) for saved in edge_saved(model, settings, first, last))


@lru_cache(maxsize=8192)
def edge_saved(model: ModelSpec, settings: ActivationSettings, first: bool, last: bool) -> tuple[Saved, ...]:
    """What the embedding (first stage) and the final LayerNorm + head + loss (last stage) save per micro-batch,
    each a term of ``memory_model`` with the numbers it takes."""
    s, h, V = model.seq_len, model.d_model, model.vocab_size
    T = s * settings.micro_batch
    r, e = settings.sp_split, settings.bytes_per_element
    terms = []
    if first:
        if settings.small_terms:
            terms.append(Saved("token_ids", MM.TOKEN_IDS, (T,)))
            if model.positions == "learned":
                terms.append(Saved("position_ids", MM.POSITION_IDS, (s,)))
        if model.dropout > 0:
            terms.append(Saved("embedding_dropout_mask", MM.EMBEDDING_DROPOUT_MASK, (T, h, settings.mask_bytes, r)))
    if last:
        rmsnorm = model.norm == "rmsnorm"
        terms += [Saved("final_layernorm_input", MM.FINAL_NORM_INPUT, (T, h, settings.norm_input_bytes(rmsnorm), r)),
                  Saved("final_layernorm_output", MM.FINAL_NORM_OUTPUT, (T, h, e, settings.ln_output_split)),
                  Saved("log_probs", MM.LOG_PROBS, (T, V, settings.tp, settings.loss_bytes))]
        terms += settings.norm_terms(T, h, rmsnorm, 1, "final_")
        if settings.small_terms:
            terms += [Saved("targets", MM.TARGETS, (T,)), Saved("loss_scalars", MM.LOSS_SCALARS, ())]
    return tuple(terms)


def in_flight(plan: ParallelPlan, stage: int) -> float:
    """Micro-batches whose activations pipeline rank ``stage`` holds at its peak (docs/formulas.md, Pipeline bubble),
    in units of all its layers' activations of one micro-batch.

    No pipeline: 1 (gradient accumulation frees each micro-batch after its backward). GPipe: all m.
    1F1B: stage i holds min(m, p − i). Interleaved: stage 0 holds p·(1 + (p−1)/(p·v)) = p + (p−1)/v
    (Korthikanti 2022); stage i is taken as (p − i) + (p − 1)/v. The zero-bubble schedules free a micro-batch's
    activations only after its weight backward, which they defer: every rank holds p (zb-interleaved, zbv) or
    p + 1/2 (dualpipev), the counts of torch's own orders (tests/trainer/parallel/test_zero_bubble_schedules.py).
    """
    return float(in_flight_saved(plan, stage).value)


def in_flight_saved(plan: ParallelPlan, stage: int) -> Saved:
    """``in_flight`` as the ``memory_model`` term of the plan's schedule and the numbers it takes."""
    pp, schedule, m = plan.pp, plan.pipeline_schedule, plan.grad_accum
    if pp <= 1:
        return Saved("in_flight", MM.IN_FLIGHT_ONE, ())
    if schedule == "gpipe":
        return Saved("in_flight", MM.IN_FLIGHT_GPIPE, (m,))
    if schedule == "interleaved":  # v = plan.virtual_stages model chunks a stage
        return Saved("in_flight", MM.IN_FLIGHT_INTERLEAVED, (m, pp, stage, plan.virtual_stages))
    if schedule == "dualpipev":
        return Saved("in_flight", MM.IN_FLIGHT_DUALPIPEV, (m, pp))
    if schedule in ZERO_BUBBLE:
        return Saved("in_flight", MM.IN_FLIGHT_ZERO_BUBBLE, (m, pp))
    return Saved("in_flight", MM.IN_FLIGHT_1F1B, (m, pp, stage))


def bubble_fraction(plan: ParallelPlan) -> float:
    """The pipeline's idle time as a fraction of a rank's work (docs/formulas.md, Pipeline bubble), with free
    transfers. GPipe and 1F1B: (p − 1)/m; interleaved: (p − 1)/(v·m). The zero-bubble schedules fill the fill and
    drain with the weight backward W of micro-batches whose input backward I already went upstream: with F, I and W
    alike (each a third of a micro-batch's work) what is left is (p − 1) of those thirds, (p − 1)/(3·v·m), v the
    chunks per rank (1 or more for zb-interleaved, 2 for zbv and dualpipev)."""
    if plan.pp <= 1 or not plan.grad_accum:
        return 0.0
    term, args = step_model.bubble(plan)
    return term.function(*args)


def holds_last_stage(plan: ParallelPlan, stage: int) -> bool:
    """Whether pipeline rank ``stage`` holds the model's last stage (final LayerNorm, head and loss): the last rank,
    or under a V-shaped schedule the first, which holds both ends."""
    return stage == (0 if plan.pipeline_schedule in V_SCHEDULES else plan.pp - 1)
