"""The memory model: every term of a rank's memory, written once (docs/formulas.md, Activation memory).

Each term is an ``expr.Term``, as in ``step_model``: ``memory`` and ``core.Planner`` compute its bytes by calling
it with the plan's numbers (a ``memory.Saved`` keeps the term and the numbers it took), ``explain`` prints its
formula from the same expression. No other module restates one (``tests/trainer/planner/test_step_model.py``
checks).

Symbols: T = s·b positions of a rank's micro-batch, h width, f MLP width, kv the keys' and values' width, a heads,
s sequence, t tensor-parallel degree, e bytes an activation element, e_stream those of the residual stream (fp32
under autocast), e_norm those of a saved norm input (e_stream, or 4 for RMSNorm upcasting on the CPU), r = t with
sequence parallel else 1, r_ln what the saved LayerNorm outputs are divided by (1 when sequence parallel keeps them
gathered), ln_copies the saved LayerNorm outputs (2; under autocast one 16-bit cast per consuming matmul, 4), norms
the norms a term counts. MoE layers (``memory.moe_activations``): E experts, k of them a token, cap slots an expert,
M kept assignments, f_e an expert's width, f_s the shared expert's. P_rank, P_shard: a rank's parameters before
and after data-parallel sharding.
"""
from __future__ import annotations

from functools import lru_cache

from trainer.planner.estimate.expr import Term, ceil, floor, lift, maximum, minimum, symbols

(T, s, h, f, a, t, e, r, r_ln) = symbols("T s h f a t e r r_ln")
(e_stream, e_norm, ln_copies, norms, stat_bytes, mask_bytes) = symbols(
    "e_stream e_norm ln_copies norms stat_bytes mask_bytes")
(kv_saved, gathers, head_dim, table_bytes, V, loss_bytes) = symbols(
    "kv_saved gathers head_dim table_bytes V loss_bytes")
(E, k, c, cap, M, f_e, f_s, mlp_saved, shared_casts) = symbols("E k c cap M f_e f_s mlp_saved shared_casts")
(P_rank, P_shard, grad_bytes, layers) = symbols("P_rank P_shard grad_bytes layers")
(weight_bytes, optimizer_bytes) = symbols("weight_bytes optimizer_bytes")
(m, p, v, stage) = symbols("m p v stage")

# ---- model states (docs/formulas.md, ZeRO §3.1): bytes a parameter of each state × the parameters a rank keeps ---
WEIGHTS = Term(weight_bytes * P_rank, "weight_bytes P_rank")
WEIGHTS_SHARDED = Term(weight_bytes * P_shard, "weight_bytes P_shard", "ZeRO-3: the rank's shard")
GRADIENTS = Term(grad_bytes * P_rank, "grad_bytes P_rank")
GRADIENTS_SHARDED = Term(grad_bytes * P_shard, "grad_bytes P_shard", "ZeRO ≥ 2: the rank's shard")
GRADIENTS_VOCABULARY_VIEW = Term(grad_bytes * P_rank + (V - ceil(V / t)) * h * grad_bytes, "grad_bytes P_rank V t h",
                                 "the vocabulary-split embedding's gradient is a 1/t view of a full V×h gradient, "
                                 "which stays allocated")
OPTIMIZER = Term(optimizer_bytes * P_rank, "optimizer_bytes P_rank")
OPTIMIZER_SHARDED = Term(optimizer_bytes * P_shard, "optimizer_bytes P_shard", "ZeRO ≥ 1: the rank's shard")
OFFLOADED = Term(lift(0), "", "offloaded: kept in host memory")

INDEX_BYTES = 8     # int64 token ids, positions, targets
RMS_STAT_BYTES = 4  # RMSNorm's 1/rms per token: fp32 always (the fused kernel and the composite one compute in fp32)

# ---- one transformer layer, one micro-batch (Korthikanti et al. 2022, Table 2, and what autograd saves) ---------
LAYERNORM_INPUTS = Term(2 * T * h * e_norm / r, "T h e_norm r", "the inputs of a layer's two norms")
LAYERNORM_OUTPUTS = Term(ln_copies * T * h * e / r_ln, "ln_copies T h e r_ln", "what the matmuls after them read")
GATE_INPUT_CAST = Term(T * h * e / r_ln, "T h e r_ln", "autocast's cast of the norm output for SwiGLU's gate")
LAYERNORM_STATS = Term(norms * 2 * T * stat_bytes / r, "norms T stat_bytes r", "each LayerNorm's mean and 1/σ")
RMSNORM_STATS = Term(norms * T * RMS_STAT_BYTES / r, "norms T r", "each RMSNorm's 1/rms, fp32")
RMSNORM_NORMALIZED = Term(norms * T * h * 4 / r, "norms T h r",
                          "fp32 x/rms before the gain: RMSNorm as separate operations, on the CPU")
DROPOUT_MASKS = Term(2 * T * h * mask_bytes / r, "T h mask_bytes r", "after attention and after the MLP")
QKV = Term(T * (h + 2 * kv_saved) * e / t, "T h kv_saved e t",
           "kv_saved = h when keys and values are repeated to the heads, kv under cp")
ATTENTION_OUTPUT = Term(T * h * e / t, "T h e t", "the out-projection's input")
ROTARY = Term(T * h * e / t, "T h e t", "rotated q, k")
ROTARY_TABLES = Term(gathers * 2 * s * floor(head_dim / 2) * table_bytes, "gathers s head_dim table_bytes",
                     "cos, sin; gathered for q and k apart under cp")
ATTENTION_SCORES = Term(T * a * s * e / t, "T a s e t", "softmax output")
ATTENTION_DROPOUT = Term(T * a * s * (mask_bytes + e) / t, "T a s mask_bytes e t", "mask + dropped scores")
CAUSAL_MASK = Term(s * s, "s", "one byte a pair of positions")
ATTENTION_LOGSUMEXP = Term(T * a * 4 / t, "T a t", "fused attention's log-sum-exp, fp32")
MLP = Term(2 * T * f * e / t, "T f e t", "up-projection output, GELU output")
SWIGLU = Term(4 * T * f * e / t, "T f e t", "gate output, SiLU output, up output, their product")
LAYER_INPUT = Term(T * h * e_stream / r, "T h e_stream r", "full recompute keeps the layer input only")

# ---- a mixture-of-experts layer's routed and shared experts, in place of the MLP ---------------------------------
ROUTER_PROBS = Term(T * E * 4.0, "T E", "softmax output, fp32")
DISPATCHED_TOKENS = Term(M * h * e_stream, "M h e_stream", "index_copy keeps its gathered source")
EXPERT_INPUTS = Term(E * cap * h * e, "E cap h e", "the dispatch buffer at capacity")
EXPERT_GATE_INPUTS = Term(E * cap * h * e, "E cap h e", "each expert's gate's cast of its rows, under autocast")
EXPERT_SWIGLU = Term(4 * E * cap * f_e * e, "E cap f_e e", "each expert's gate, SiLU, up and product outputs")
EXPERT_MLP = Term(2 * E * cap * f_e * e, "E cap f_e e", "each expert's up-projection and GELU outputs")
COMBINE = Term(2 * M * h * e, "M h e", "gathered expert outputs, gated outputs kept by index_add")
_ROUTING = T * k * INDEX_BYTES + T * k + 2 * M * INDEX_BYTES + M * e + E * 4
ROUTING_SMALL = Term(_ROUTING, "T k M e E", "top-k indices, kept mask, row/slot indices, gates, aux fractions")
ROUTING_SMALL_RENORMALIZED = Term(_ROUTING + T * k * 4 + T * 4, "T k M e E",
                                  "top-k indices, kept mask, row/slot indices, gates, aux fractions, the "
                                  "renormalisation of the top-k probabilities")
SHARED_EXPERT = Term(mlp_saved * T * f_s * e, "mlp_saved T f_s e", "the shared expert's MLP on every token")
SHARED_EXPERT_INPUT_CASTS = Term(shared_casts * T * h * e, "shared_casts T h e",
                                 "the shared expert's and its gate's casts, under autocast")
SHARED_EXPERT_OUTPUT = Term(T * h * e, "T h e", "kept by the gate's multiply")
SHARED_GATE_SMALL = Term(T * e, "T e", "the gate's sigmoid")

# ---- the edges of the model: the embedding (first stage), the final norm, head and loss (last stage) -------------
TOKEN_IDS = Term(T * INDEX_BYTES, "T", "int64")
POSITION_IDS = Term(s * INDEX_BYTES, "s", "int64, learned positions")
EMBEDDING_DROPOUT_MASK = Term(T * h * mask_bytes / r, "T h mask_bytes r")
FINAL_NORM_INPUT = Term(T * h * e_norm / r, "T h e_norm r")
FINAL_NORM_OUTPUT = Term(T * h * e / r_ln, "T h e r_ln")
LOG_PROBS = Term(T * ceil(V / t) * loss_bytes, "T V t loss_bytes", "the loss's log-softmax over a rank's vocabulary")
TARGETS = Term(T * INDEX_BYTES, "T", "int64")
LOSS_SCALARS = Term(lift(4), "", "fp32")

# ---- transient buffers beside the saved activations ------------------------------------------------------------
LOGITS_AND_GRAD = Term(2 * T * ceil(V / t) * loss_bytes, "T V t loss_bytes", "the logits and their gradient")
GATHERED_PARAMS = Term(2 * (P_rank / layers) * e + (P_rank / layers) * grad_bytes, "P_rank layers e grad_bytes",
                       "two gathered layers (current + prefetch) and one layer's unsharded gradient")
DDP_BUCKETS = Term(P_rank * grad_bytes, "P_rank grad_bytes", "DDP's flat gradient buckets")
ZERO_BUCKETS = Term(2 * minimum(5e8, P_rank) * grad_bytes, "P_rank grad_bytes",
                    "reduce + all-gather buckets of 5e8 elements")
AUTOCAST_WEIGHT_COPIES = Term(2 * P_rank, "P_rank", "16-bit casts of fp32 weights saved for backward")
PIPELINE_P2P = Term(2 * T * h * e / r, "T h e r", "send + receive")
ALL_TO_ALL = Term(2 * T * k * c * h * e, "T k c h e", "dispatch and combine buffers")

# ---- a stage's activations, what the allocator loses, what the GPU has -------------------------------------------
(in_flight, per_microbatch, fragmentation, dynamic, memory_gb) = symbols(
    "in_flight activations_per_microbatch fragmentation dynamic memory_gb")
ACTIVATIONS = Term(in_flight * per_microbatch, "in_flight activations_per_microbatch")
FRAGMENTATION = Term(fragmentation * dynamic, "fragmentation dynamic",
                     "the allocator's loss of the dynamic part: activations in flight + buffers")
CAPACITY = Term(memory_gb * 1e9, "memory_gb", "gpu.memory_gb")
(expected,) = symbols("expected")
FIXED_OVERHEAD = Term(expected, "expected", "its low and high beside it")


@lru_cache(maxsize=None)
def peak(stages: tuple[int, ...]) -> Term:
    """A rank's peak over the totals of the pipeline ranks ``stages`` (those that may hold it): the largest."""
    names = " ".join(f"stage_{stage}" for stage in stages)
    if len(stages) == 1:
        return Term(symbols(names)[0], names, "the stage total")
    return Term(maximum(*symbols(names)), names, "the largest stage total")


# ---- micro-batches in flight on a pipeline rank (docs/formulas.md, Pipeline bubble) ------------------------------
IN_FLIGHT_ONE = Term(lift(1), "", "no pipeline: each micro-batch is freed after its backward")
IN_FLIGHT_GPIPE = Term(m, "m", "GPipe: every micro-batch")
IN_FLIGHT_1F1B = Term(minimum(m, p - stage), "m p stage", "1F1B")
IN_FLIGHT_INTERLEAVED = Term(minimum(m, (p - stage) + (p - 1) / v), "m p stage v",
                             "interleaved 1F1B, Korthikanti 2022")
IN_FLIGHT_ZERO_BUBBLE = Term(minimum(m, p), "m p", "every rank, weight backward deferred")
IN_FLIGHT_DUALPIPEV = Term(minimum(m, p + 0.5), "m p", "dualpipev: every rank, weight backward deferred")
