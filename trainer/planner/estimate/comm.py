"""Communication: where a group of ranks sits, what a ring collective costs, and how many collectives a step issues.

Rank layout (the native trainer's device mesh): a (pp, dp, cp, tp) grid with tp innermost, so
rank = ((stage·dp + d)·cp + c)·tp + j. A group of n ranks with stride k sits inside one node when n·k ≤ gpus_per_node
(tp: stride 1; cp: t; the gradient group dp·cp and ep: t; pp: t·c·d) and then uses the intra-node bandwidth, else
the inter-node one.

Costs follow the α–β ring model (docs/formulas.md, Communication cost model): bandwidth prices a collective by its
bytes, S/β times a ring factor; latency α is paid per ring step, which is what the hop counts below are for.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.contract import ParallelPlan
from trainer.planner.estimate import step_model as S

# DDP's default bucket_cap_mb: gradients are all-reduced in ~25 MB buckets, one collective each
DDP_BUCKET_BYTES = 25 * 1024 * 1024
# DeepSpeed's default reduce_bucket_size, in elements
ZERO_BUCKET_ELEMENTS = 5e8


# how ``rank_of`` numbers the ranks, and which rank an estimate's figures are of
RANK_RULE = ("rank = ((stage·dp + d)·cp + c)·tp + j; the figures are for d = 0, c = 0, j = 0 (the largest shards)")
# which bandwidth a group's collectives get (``Planner.bandwidths``)
BANDWIDTH_RULE = ("intra-node if group size × stride ≤ gpus_per_node, else inter-node (a ring collective's: × its "
                  "ranks on a node, at most intra-node); × comm_efficiency")


def rank_of(plan: ParallelPlan, stage: int, d: int = 0, j: int = 0, c: int = 0) -> int:
    """Global rank of pipeline stage ``stage``, data-parallel index d, context-parallel index c, tensor-parallel
    index j."""
    return ((stage * plan.dp + d) * plan.cp + c) * plan.tp + j


def fits_in_node(size: int, stride: int, gpus_per_node: int) -> bool:
    return size * stride <= gpus_per_node


def ring_all_reduce_s(nbytes: float, n: int, bandwidth: float) -> float:
    """2·(n−1)/n · S/β."""
    return 2 * (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


def ring_gather_s(nbytes: float, n: int, bandwidth: float) -> float:
    """All-gather or reduce-scatter of S bytes in total: (n−1)/n · S/β."""
    return (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


def tp_all_reduces_per_layer(plan: ParallelPlan) -> int:
    """The tensor-parallel all-reduces one layer issues per micro-batch, or with sequence parallel their bytes in
    reduce-scatters and all-gathers: two forward and two backward (Shoeybi et al. 2019), two more when full
    recompute runs the forward again. Megatron-LM's sequence parallel keeps only the 1/t shard of each
    column-parallel layer's input (its memory convention) and gathers it again in the backward for the weight
    gradient: two all-gathers more, one all-reduce's bytes."""
    n = 6 if plan.activation_checkpointing == "full" else 4
    return n + 1 if plan.sequence_parallel and plan.engine == "megatron" else n


@dataclass(slots=True)
class Collectives:
    """What one rank issues per step, by group (tp, ep, pp, dp): collectives (messages) and the ring steps they take.

    Step time adds α · hops for each group."""

    calls: dict[str, float]
    hops: dict[str, float]


def pipeline_scatter_gather(plan: ParallelPlan) -> bool:
    """Megatron-LM's scatter/gather between pipeline stages (Narayanan et al. 2021, §4.1; on unless
    ``--no-scatter-gather-tensors-in-pipeline``): each of the t tensor-parallel ranks sends its 1/t of the activation,
    each over its own link, and the receiving stage's ranks all-gather it over NVLink. Under sequence parallel the
    activation is sharded already; the trainer's own pipeline sends what a rank holds."""
    return plan.engine == "megatron" and plan.pp > 1 and plan.tp > 1 and not plan.sequence_parallel


def collective_counts(plan: ParallelPlan, n_layers: int, moe_layers_per_stage: int, grad_bytes: float,
                      params_first: int, stage_layers: int | None = None) -> Collectives:
    """The collectives one rank issues per step, and their latency hops, by group.

    Bandwidth alone prices a collective by its bytes; small ones (tiny models, gloo, many FSDP units) are paid per
    call. In the ring model an all-reduce over n ranks is 2·(n−1) steps, 2·(n−1)·α + 2·(n−1)/n·S/β; an all-gather
    or reduce-scatter (n−1)·α + (n−1)/n·S/β; an all-to-all (n−1)·α + …; a point-to-point message α + S/β.
    Hops = Σ collectives × their steps. Counts follow what the trainer issues:
      tp  m · [layers · n + edges] all-reduces, n = 4 a layer (2 forward, 2 backward; docs/formulas.md,
          Communication cost model), 6 with full recompute (the forward runs twice), one more with Megatron-LM's
          sequence parallel (``tp_all_reduces_per_layer``); edges: the
          vocabulary-parallel embedding forward and the head input backward (2; with a pipeline the first stage
          holds one and the last the other: 1); sequence parallel replaces each by an all-gather and a
          reduce-scatter (twice the calls, the same hops)
      ep  m · moe_layers · 4 all-to-alls (dispatch and combine, forward and backward)
      pp  m · v · 2 messages (an activation forward and its gradient back, per micro-batch per chunk); under
          Megatron-LM's scatter/gather as many all-gathers on tp (``pipeline_scatter_gather``)
      cp  m · layers · the ring's point-to-point hops (``ring_attention``: cp − 1 forward, cp − 1 + cp backward)
      dp  over the dp·cp ranks that average gradients. ZeRO-3 (FSDP2: one unit per block + a root per chunk, v with
          interleaving): m · (units + layers) all-gathers (forward, and the backward re-gather of each block; not with a
          pipeline, which keeps blocks gathered, nor for the root, which FSDP2 does not reshard) + units reduce-scatters
          (once a step: gradient sync on the last micro-batch); DDP: ⌈grad bytes / 25 MiB⌉ bucket all-reduces; tp > 1 or
          pp > 1 (the trainer's flat gradient sync after backward): 1 all-reduce; DeepSpeed ZeRO 0–2: ⌈P_rank / 5e8⌉
          buckets.
    """
    m = plan.grad_accum
    calls: dict[str, float] = {}
    hops: dict[str, float] = {}
    layers = n_layers // plan.pp if stage_layers is None else stage_layers  # the pacing rank's, when uneven
    v = plan.model_chunks
    if plan.tp > 1:
        all_reduces = m * (layers * tp_all_reduces_per_layer(plan) + (2 if plan.pp == 1 else 1))
        calls["tp"] = float(all_reduces * (2 if plan.sequence_parallel else 1))
        hops["tp"] = float(all_reduces * 2 * (plan.tp - 1))
        if pipeline_scatter_gather(plan):
            calls["tp"] += m * v * 2
            hops["tp"] += m * v * 2 * (plan.tp - 1)
    if plan.ep > 1 and moe_layers_per_stage:
        calls["ep"] = float(m * moe_layers_per_stage * 4)
        hops["ep"] = calls["ep"] * (plan.ep - 1)
    if plan.pp > 1:
        calls["pp"] = hops["pp"] = float(m * v * 2)
    if plan.cp > 1:
        calls["cp"] = hops["cp"] = float(m * layers * ring_attention(
            1, 1, 1, 1, plan.cp, 1, 1.0, 1.0, plan.activation_checkpointing == "full").hops)
    replicas = plan.dp * plan.cp  # ranks holding the same weights: the gradient average's group
    if replicas > 1:
        if plan.zero_stage >= 3:
            units = layers + v
            regather = layers if plan.pp == 1 else 0
            calls["dp"] = float(m * (units + regather) + units)
            hops["dp"] = calls["dp"] * (replicas - 1)
        else:
            if plan.engine == "deepspeed":
                calls["dp"] = float(-(-params_first // ZERO_BUCKET_ELEMENTS))
            elif plan.tp > 1 or plan.pp > 1:
                calls["dp"] = 1.0
            else:
                calls["dp"] = float(-(-grad_bytes // DDP_BUCKET_BYTES))
            hops["dp"] = calls["dp"] * 2 * (replicas - 1)
    return Collectives(calls, hops)


# ---- context parallel: the K/V ring of each attention --------------------------------------------------------


@dataclass(slots=True)
class RingAttention:
    """One layer's ring attention for one micro-batch on one rank (docs/formulas.md, Context parallel): the bytes it
    sends, the seconds those take, the seconds of attention each hop hides behind, and what stays exposed."""

    sent_bytes: float
    transfer_s: float
    exposed_s: float
    hops: int


def ring_attention(tokens: float, d_model: int, kv_dim: int, tp: int, cp: int, e: int, bandwidth: float,
                   flops_per_s: float, full_recompute: bool = False) -> RingAttention:
    """The K/V ring of one layer, one micro-batch, one rank holding ``tokens`` = b·s/cp positions and h/t query
    and kv/t key/value widths.

    Forward: cp − 1 hops, each sending this rank's K and V block, 2·tokens·(kv/t)·e bytes, while the block in hand
    is computed: a half-block of attention, 2·tokens²·(h/t) FLOPs (q kᵀ and p v over tokens × tokens/2 pairs,
    the zig-zag split makes every step, the causal diagonal included, that size). Backward: the K/V blocks go round
    again (cp − 1 hops) beside their gradient accumulators (cp hops, fp32), each hop hidden behind twice the
    forward's FLOPs. A hop's transfer shows only where it outlasts the attention it overlaps; the last
    accumulator's hop home overlaps nothing. Full recompute runs the forward ring twice."""
    if cp <= 1:
        return RingAttention(0.0, 0.0, 0.0, 0)
    kv_block = S.KV_BLOCK(tokens, kv_dim, tp, e)
    grad_block = S.GRAD_BLOCK(tokens, kv_dim, tp)
    half_block_s = S.HALF_BLOCK(tokens, d_model, tp, flops_per_s)
    forwards = 2 if full_recompute else 1
    fwd_hop, bwd_hop = kv_block / bandwidth, (kv_block + grad_block) / bandwidth
    sent = forwards * (cp - 1) * kv_block + (cp - 1) * kv_block + cp * grad_block
    transfer = forwards * (cp - 1) * fwd_hop + (cp - 1) * bwd_hop + grad_block / bandwidth
    exposed = S.RING_EXPOSED(forwards, cp, kv_block, grad_block, bandwidth, half_block_s)
    hops = forwards * (cp - 1) + 2 * (cp - 1) + 1
    return RingAttention(sent, transfer, exposed, hops)
