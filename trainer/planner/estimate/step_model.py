"""The step-time model: every term of a step, written once (docs/formulas.md).

Each term is an ``expr.Term``: ``core.Planner.step_time`` computes its value by calling it with the plan's numbers,
``explain`` prints its formula from the same expression, and calibration reads its features off the planner. No
other module restates a formula of step time (``tests/trainer/planner/test_step_model.py`` checks).

Symbols: B global batch, s sequence, T positions of a rank's micro-batch, h width, t tensor-, p pipeline-, d (and dp)
data-parallel degree (× cp), m micro-batches a step, v model chunks a rank, r = t with sequence parallel else 1, e
bytes an activation element; the rest are named for what they are.
"""
from __future__ import annotations

from functools import lru_cache

from trainer.contract import ParallelPlan
from trainer.contract.schedules import ZERO_BUBBLE
from trainer.planner.estimate.expr import Term, ceil, maximum, symbols

(B, s, dp, d, p, t, ep, m, v, T, h, e, r, k, c, L) = symbols("B s dp d p t ep m v T h e r k c L")
(layers, moe_stage, moe_layers, n_allreduce, passes) = symbols(
    "layers_per_stage moe_layers_per_stage moe_layers n_allreduce passes")
(F_blocks, F_head, head, peak, efficiency) = symbols("F_blocks F_head head_on_pace_rank peak_flops efficiency")
(dense_s, moe_s, head_s, weight_grad_s) = symbols("dense_layer_s moe_layer_s head_s weight_grad_s")
(bandwidth, tp_bandwidth, latency, ring_exposed) = symbols(
    "bandwidth_bytes_per_s tp_bandwidth_bytes_per_s latency_s ring_exposed_s")
(P_rank, P_shard, grad_bytes, overlap) = symbols("P_rank P_shard grad_bytes overlap")
(hbm, accumulation_bytes, optimizer_bytes) = symbols("hbm_bytes_per_s accumulation_bytes optimizer_bytes")
(pcie, host_bw) = symbols("pcie_bandwidth_bytes_per_s host_memory_bandwidth_bytes_per_s")
(layer_overhead, microbatch_overhead, expert_overhead, experts_per_rank, step_overhead) = symbols(
    "layer_overhead_s microbatch_overhead_s expert_overhead_s experts_per_rank step_overhead_s")
(alpha, hops, call_s, calls) = symbols("alpha_s hops call_s calls")
(compute_efficiency, w_half) = symbols("compute_efficiency w_half")
(work, bubble, compute_s) = symbols("microbatch_work_s bubble compute_s")

# ---- compute ---------------------------------------------------------------------------------------------------
# the pacing rank's hardware FLOPs at peak: its blocks' share and, where it holds the last stage, the head
AT_PEAK = B * s / dp * (F_blocks * layers / L + head * F_head) / t / peak
PACE = "B s dp F_blocks layers_per_stage L head_on_pace_rank F_head t peak_flops"
COMPUTE_FLOPS = Term(AT_PEAK / efficiency, PACE + " efficiency",
                     "the pacing rank's hardware FLOPs at peak · efficiency: its blocks' share and, where it holds the "
                     "last stage, the head")
EFFICIENCY = Term(compute_efficiency * (T * h / t) / (T * h / t + w_half), "compute_efficiency T h t w_half",
                  "a micro-batch's matmuls, (T tokens) × (h/t columns), fill the device as their shape grows")
COMPUTE_KERNELS = Term(m * ((layers - moe_stage) * dense_s + moe_stage * moe_s + head * head_s),
                       "m layers_per_stage moe_layers_per_stage dense_layer_s moe_layer_s head_on_pace_rank head_s",
                       "kernel by kernel on the pacing rank: each GEMM at the GPU's measured rate and its shape's tile "
                       "and wave efficiency, attention, and the kernels that stream activations through HBM; "
                       "docs/formulas.md, Compute from the kernels")
(gemm, attention, elementwise) = symbols("gemm attention elementwise")
PASS_KERNELS = Term(gemm + attention + elementwise, "gemm attention elementwise",
                    "a pass's GEMMs, its attention core and the kernels that stream activations")
KERNEL_EFFICIENCY = Term(AT_PEAK / compute_s, PACE + " compute_s", "what the kernels reach of the peak")

# ---- host work a micro-batch dispatches ------------------------------------------------------------------------
HOST_OVERHEAD = Term(m * (layers * passes * layer_overhead + microbatch_overhead),
                     "m layers_per_stage passes layer_overhead_s microbatch_overhead_s",
                     "host dispatch per layer and per micro-batch, whatever their size; passes = 1.5 with full "
                     "recompute")
EXPERT_OVERHEAD = Term(m * moe_stage * passes * experts_per_rank * expert_overhead,
                       "m moe_layers_per_stage passes experts_per_rank expert_overhead_s",
                       "host dispatch of each expert a rank holds, one after another in every MoE layer: its small "
                       "GEMMs on T·k·c/E capacity rows, forward and backward; experts_per_rank = E/ep")

# ---- communication ---------------------------------------------------------------------------------------------
LATENCY = Term(alpha * hops + call_s * calls, "alpha_s hops call_s calls",
               "α–β ring model: all-reduce 2·(n−1) steps, all-gather/reduce-scatter/all-to-all n−1, a pipeline "
               "message 1; docs/formulas.md, Communication cost model; call_s: each call's fixed host cost")
ALL_REDUCE = 2 * (t - 1) / t * T * h * e / bandwidth   # a ring all-reduce of one layer's activations
TP = "m layers_per_stage n_allreduce t T h e bandwidth_bytes_per_s latency_s"
TENSOR_PARALLEL = Term(m * layers * n_allreduce * ALL_REDUCE + latency, TP,
                       "ring all-reduces; n_allreduce = 4 a layer, 6 with full recompute, one more with "
                       "Megatron-LM's sequence parallel (its backward gathers each column-parallel input again)")
TENSOR_PARALLEL_OVERLAP = Term(
    m * layers * ((n_allreduce - 2) * ALL_REDUCE + maximum(0, 2 * ALL_REDUCE - weight_grad_s)) + latency,
    TP + " weight_grad_s", "the backward's two input-gradient all-reduces (with sequence parallel: the re-gathers "
                           "and reduce-scatters) run behind the weight-gradient GEMMs")
# one layer's K/V ring for one micro-batch (comm.ring_attention; docs/formulas.md, Context parallel)
(kv, cp, forwards, flops_per_s, S_kv, S_grad, half_block) = symbols("kv cp forwards flops_per_s S_kv S_grad a")
RING_GRAD_BYTES = 4  # the ring's dK/dV accumulators travel in fp32 (trainer/parallel/context.py)
KV_BLOCK = Term(2 * T * (kv / t) * e, "T kv t e", "a rank's K and V block")
GRAD_BLOCK = Term(2 * T * (kv / t) * RING_GRAD_BYTES, "T kv t", "their gradient accumulators, fp32")
HALF_BLOCK = Term(2 * T * T * (h / t) / flops_per_s, "T h t flops_per_s",
                  "a half-block of attention, q kᵀ and p v over T × T/2 pairs; flops_per_s = peak_flops · efficiency")
RING_EXPOSED = Term(forwards * (cp - 1) * maximum(0, S_kv / bandwidth - half_block)
                    + (cp - 1) * maximum(0, (S_kv + S_grad) / bandwidth - 2 * half_block) + S_grad / bandwidth,
                    "forwards cp S_kv S_grad bandwidth_bytes_per_s a",
                    "cp − 1 forward hops of K and V; backward, cp − 1 more beside cp hops of the fp32 gradient "
                    "accumulators, the last one home hidden by nothing; the forward ring twice with full recompute")
CONTEXT_PARALLEL = Term(m * layers * ring_exposed + latency, "m layers_per_stage ring_exposed_s latency_s",
                        "the K/V ring of each attention, what of its hops the blocks' attention does not hide; "
                        "docs/formulas.md, Context parallel")
EXPERT_ALL_TO_ALL = Term(m * moe_layers * 4 * (ep - 1) / ep * T * k * c * h * e / bandwidth + latency,
                         "m moe_layers ep T k c h e bandwidth_bytes_per_s latency_s",
                         "dispatch and combine, forward and backward")
GRADIENT_ACCUMULATION = Term(m * P_rank * accumulation_bytes / hbm, "m P_rank accumulation_bytes hbm_bytes_per_s",
                             "each micro-batch's weight gradients folded into the step's: the cast of 16-bit "
                             "gradients to the gradient's dtype, and an add from the second micro-batch on")
PIPELINE_P2P = Term(m * v * 2 * (T * h * e / r) / bandwidth + latency, "m v T h e r bandwidth_bytes_per_s latency_s",
                    "an activation forward and its gradient back, per micro-batch and model chunk")
PIPELINE_P2P_SCATTER_GATHER = Term(
    m * v * 2 * (T * h * e / t / bandwidth + (t - 1) / t * T * h * e / tp_bandwidth) + latency,
    "m v T h e t bandwidth_bytes_per_s tp_bandwidth_bytes_per_s latency_s",
    "Megatron-LM's scatter/gather: each tensor-parallel rank sends 1/t of the activation (and of its gradient back) "
    "over its own link, and the receiving ranks all-gather the slices over the node")
DP = "overlap d P_rank grad_bytes bandwidth_bytes_per_s latency_s"
DATA_PARALLEL = Term((1 - overlap) * (2 * (d - 1) / d * P_rank * grad_bytes / bandwidth + latency), DP,
                     "ring all-reduce of the gradients")
DATA_PARALLEL_ZERO3 = Term((1 - overlap) * (2 * m * (d - 1) / d * P_rank * e / bandwidth
                                            + (d - 1) / d * P_rank * grad_bytes / bandwidth + latency), DP + " m e",
                           "all-gathers of the weights for forward and backward of each micro-batch, one "
                           "reduce-scatter of the gradients")

# ---- the pipeline's bubble (docs/formulas.md, Pipeline bubble) -------------------------------------------------
@lru_cache(maxsize=None)
def microbatch_work(parts: tuple[str, ...]) -> Term:
    """A micro-batch's work, what the bubble stretches: the sum of the step's ``parts`` that each micro-batch pays
    (``numbers.IN_MICROBATCH``, those of the plan)."""
    first, *rest = symbols(" ".join(parts))
    return Term(sum(rest, first), " ".join(parts), "a micro-batch's work: what the bubble stretches")


PIPELINE_BUBBLE = Term(work * bubble, "microbatch_work_s bubble",
                       "a micro-batch's work, idle for the bubble's share of it")
BUBBLE = Term((p - 1) / (v * m), "p v m", "the work of p − 1 micro-batches spread over v·m, idle in the fill and drain")
BUBBLE_ZERO = Term((p - 1) / (3 * v * m), "p v m",
                   "the third of a micro-batch's work that is neither forward nor input backward nor weight backward "
                   "of another, idle in the fill and drain")

# ---- outside the micro-batches ---------------------------------------------------------------------------------
OFFLOAD = "P_shard pcie_bandwidth_bytes_per_s"
OFFLOAD_OPTIMIZER = Term(2 * 2 * P_shard / pcie + 16 * P_shard / host_bw,
                         OFFLOAD + " host_memory_bandwidth_bytes_per_s",
                         "16-bit gradients down and weights up over PCIe; Adam on the host reads and writes ~16 bytes "
                         "a parameter")
OFFLOAD_PARAMS = Term(2 * m * 2 * P_shard / pcie, OFFLOAD + " m",
                      "weights up for the forward and the backward of each micro-batch")
OFFLOAD_BOTH = Term((2 * 2 * P_shard + 2 * m * 2 * P_shard) / pcie + 16 * P_shard / host_bw,
                    OFFLOAD + " host_memory_bandwidth_bytes_per_s m",
                    "16-bit gradients down and weights up over PCIe, weights up for forward and backward of each "
                    "micro-batch; Adam on the host reads and writes ~16 bytes a parameter")
OPTIMIZER = Term(P_shard * optimizer_bytes / hbm, "P_shard optimizer_bytes hbm_bytes_per_s",
                 "AdamW streams the gradient three times and reads and writes weights and optimizer states once")
STEP_OVERHEAD = Term(step_overhead, "step_overhead_s", "options.step_overhead_s")


# ---- a step's throughput and a run's budget --------------------------------------------------------------------
(step, steps, tokens, token_budget, seconds, gpus, gpu_hours, gpu_hour_cost) = symbols(
    "step steps tokens token_budget seconds gpus gpu_hours gpu_hour_cost")
TOKENS_PER_S = Term(B * s / step, "B s step", "B sequences of s tokens a step")
BUDGET_TOKENS = Term(token_budget, "token_budget", "requested")
BUDGET_STEPS = Term(ceil(tokens / (B * s)), "tokens B s", "B sequences of s tokens a step")
RUN_TIME = Term(steps * step, "steps step")
BUDGET_GPU_HOURS = Term(seconds * gpus / 3600, "seconds gpus")
BUDGET_COST = Term(gpu_hours * gpu_hour_cost, "gpu_hours gpu_hour_cost")


def offload_term(optimizer: bool, params: bool) -> Term:
    return OFFLOAD_BOTH if optimizer and params else (OFFLOAD_OPTIMIZER if optimizer else OFFLOAD_PARAMS)


def bubble(plan: ParallelPlan) -> tuple[Term, tuple[int, int, int]]:
    """The pipeline's bubble, a fraction of a rank's work: the term of the plan's schedule and the numbers it takes.
    Step time, memory's ``bubble_fraction`` and through it calibration call this."""
    return (BUBBLE_ZERO if plan.pipeline_schedule in ZERO_BUBBLE else BUBBLE), (plan.pp, plan.model_chunks,
                                                                                 plan.grad_accum)
