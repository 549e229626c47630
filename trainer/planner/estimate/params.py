"""Exact parameter counts: the whole model, per token (MoE active), and on one rank.

A GPT block (docs/formulas.md, Parameters) holds, with kv = n_kv_heads·head_dim and f the FFN width:
    ln1, ln2              2·(h + h)                 (weight + bias; weight only without biases)
    attention  q, k, v    h·(h + 2kv) + (h + 2kv)   column-parallel (rows split by t)
               out        h·h + h                   row-parallel (columns split by t, bias replicated)
    MLP        up         f·h + f                   column-parallel
               down       h·f + h                   row-parallel
= 12h² + 13h for kv = h, f = 4h. A Llama block: RMSNorms of h (no bias), q/k/v biases only where the model has them
(Qwen2), and a SwiGLU MLP of three matrices, gate and up (column-parallel) and down: 3hf. A mixture-of-experts
block swaps the MLP for E routed experts of width f_e = moe_ffn (2hf_e + f_e + h, or 3hf_e, each), a router h·E
and, in Qwen2-MoE, a shared expert of width f_s and its 1×h gate; the first ``first_dense_layers`` keep the dense
MLP. Outside the blocks: token embedding V·h (vocabulary split by t), learned positions s·h, the final norm and,
when untied, an LM head V·h.

Placement on ranks: a pipeline's first stage holds the embeddings, its last the final LayerNorm and the head; each
stage its layers, L/(p·v) or the plan's own layout's (``layout``, ``stage_layers``). A tied
head on the last stage of a pipeline (pp > 1) is a copy of the embedding: counted on both stages, once in the total.
Tensor parallel splits a dimension as torch.chunk does (ceil(d/t) on the first ranks); FSDP / ZeRO-3 then chunks
dimension 0 of each local tensor over the data-parallel ranks the same way, which is what the native trainer stores.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.schedules import V_SCHEDULES
from trainer.contract.stages import is_uneven, stage_layer_counts
from trainer.planner.estimate.expr import Term
from trainer.planner.estimate.params_model import (ACTIVE, EMBEDDING, EMBEDDING_LEARNED, MATMUL_PER_TOKEN,
                                                    MATMUL_PER_TOKEN_MOE, NON_EMBEDDING, RANK, TOTAL, TOTAL_MOE)


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor kind: shape (rows, cols) (cols 1 for vectors), split dimension under tensor parallel."""

    name: str
    rows: int
    cols: int = 1
    tp_dim: int | None = None  # 0 column-parallel rows, 1 row-parallel columns, None replicated
    expert: bool = False       # spread over expert-parallel ranks

    @property
    def numel(self) -> int:
        return self.rows * self.cols


def chunk(size: int, parts: int, index: int) -> int:
    """Length of part ``index`` when torch.chunk splits ``size`` into ``parts``: ceil-sized chunks, last ones short."""
    if parts <= 1:
        return size
    step = -(-size // parts)
    return max(0, min(step, size - index * step))


def _norm(name: str, h: int, bias: bool) -> list[ParamTensor]:
    """A LayerNorm (gain, and a bias when ``bias``) or an RMSNorm (gain only: pass bias=False)."""
    return [ParamTensor(f"{name}.weight", h)] + ([ParamTensor(f"{name}.bias", h)] if bias else [])


def _linear(name: str, out: int, inp: int, bias: bool, tp_dim: int | None, expert: bool = False) -> list[ParamTensor]:
    tensors = [ParamTensor(f"{name}.weight", out, inp, tp_dim, expert)]
    if bias:  # a row-parallel layer adds its bias once, after the reduction: replicated
        tensors.append(ParamTensor(f"{name}.bias", out, 1, 0 if tp_dim == 0 else None, expert))
    return tensors


def mlp_tensors(model: ModelSpec, name: str, width: int, expert: bool = False) -> list[ParamTensor]:
    """One MLP of ``width``: up (column-parallel) and down (row-parallel), and for SwiGLU the gate beside up."""
    h, bias = model.d_model, model.has_mlp_bias
    gate = _linear(f"{name}.gate", width, h, bias, 0, expert) if model.is_gated else []
    return gate + _linear(f"{name}.up", width, h, bias, 0, expert) + _linear(f"{name}.down", h, width, bias, 1, expert)


def block_tensors(model: ModelSpec, moe: bool) -> list[ParamTensor]:
    """The tensors of one block, named as the native trainer names them (q, k, v are separate tensors, which
    matters for FSDP's per-tensor chunks); a MoE block lists one routed expert's tensors (× n_experts in the
    counts), then its shared expert and that expert's gate, which every token passes through."""
    h, kv = model.d_model, model.kv_heads * model.head_dim
    norm_bias, qkv_bias = model.has_norm_bias, model.has_qkv_bias
    tensors = _norm("ln1", h, norm_bias) + _linear("attn.q", h, h, qkv_bias, 0) \
        + _linear("attn.k", kv, h, qkv_bias, 0) + _linear("attn.v", kv, h, qkv_bias, 0) \
        + _linear("attn.out", h, h, model.has_attention_out_bias, 1) + _norm("ln2", h, norm_bias)
    if not moe:
        return tensors + mlp_tensors(model, "mlp", model.ffn)
    tensors += [ParamTensor("mlp.router.weight", model.n_experts, h)]
    tensors += mlp_tensors(model, "mlp.experts.e", model.moe_ffn, expert=True)
    if model.shared_expert_ffn:
        tensors += mlp_tensors(model, "mlp.shared", model.shared_expert_ffn)
        if model.shared_expert_gate:
            tensors.append(ParamTensor("mlp.shared_gate.weight", 1, h))
    return tensors


def embedding_tensors(model: ModelSpec) -> list[ParamTensor]:
    tensors = [ParamTensor("embed.tokens.weight", model.vocab_size, model.d_model, 0)]
    if model.positions == "learned":
        tensors.append(ParamTensor("embed.positions.weight", model.seq_len, model.d_model))
    return tensors


def final_tensors(model: ModelSpec, pipelined: bool) -> list[ParamTensor]:
    """Final norm and the head; a tied head is a separate copy only when the last stage is not the first."""
    tensors = _norm("norm", model.d_model, model.has_norm_bias)
    if not model.tied_embeddings or pipelined:
        tensors.append(ParamTensor("head.weight", model.vocab_size, model.d_model, 0))
    return tensors


def _sum(tensors, experts: int = 1) -> int:
    return sum(t.numel * (experts if t.expert else 1) for t in tensors)


@dataclass(frozen=True)
class ParamCounts:
    total: int            # distinct parameters (a tied head once)
    active: int           # per token: k of E experts
    embedding: int        # V·h (+ s·h)
    non_embedding: int    # blocks + final LayerNorm (+ untied head)
    per_dense_block: int
    per_moe_block: int    # 0 for dense models
    head: int             # V·h when untied, else 0
    matmul_per_token: int  # parameters a token multiplies by: active blocks' weights + the head (tied or not)


def block_matmul_params(model: ModelSpec, moe: bool) -> int:
    """Matmul parameters a token passes through in one block: every weight matrix (the router and k of E experts
    in an MoE block); not the biases or LayerNorms, which cost O(h) per token, not O(h²). 0 for ``moe`` on a dense
    model."""
    if moe and not model.is_moe:
        return 0
    return sum(t.numel * (model.top_k if t.expert else 1) for t in block_tensors(model, moe) if t.cols > 1)


def expert_params(model: ModelSpec) -> int:
    """Parameters of one routed expert of an MoE block (up and down projections, and gate for SwiGLU); 0 for a
    dense model."""
    return _sum(t for t in block_tensors(model, True) if t.expert) if model.is_moe else 0


def final_layernorm_params(model: ModelSpec) -> int:
    return _sum(_norm("norm", model.d_model, model.has_norm_bias))


@lru_cache(maxsize=256)
def count(model: ModelSpec) -> ParamCounts:
    counted = {name: term(*args) for name, (term, args) in count_terms(model).items()}
    return ParamCounts(**counted, per_dense_block=_sum(block_tensors(model, False)),
                       per_moe_block=_moe_block(model, model.n_experts), head=_head(model))


def count_terms(model: ModelSpec) -> dict[str, tuple[Term, tuple[int, ...]]]:
    """The terms ``count`` computes with and the numbers each takes: total, active, embedding, non_embedding and
    matmul_per_token."""
    n_moe = len(model.moe_layers)
    n_dense = model.n_layers - n_moe
    V, h = model.vocab_size, model.d_model
    dense = _sum(block_tensors(model, False))
    embedding = (EMBEDDING_LEARNED, (V, h, model.seq_len)) if model.positions == "learned" else (EMBEDDING, (V, h))
    embedding_params = embedding[0](*embedding[1])
    outside = (embedding_params, final_layernorm_params(model), _head(model))
    if model.is_moe:
        total = (TOTAL_MOE, (n_dense, dense, n_moe, _moe_block(model, model.n_experts), *outside))
        matmul = (MATMUL_PER_TOKEN_MOE, (n_dense, block_matmul_params(model, False), n_moe,
                                         block_matmul_params(model, True), V, h))
    else:
        total = (TOTAL, (model.n_layers, dense, *outside))
        matmul = (MATMUL_PER_TOKEN, (model.n_layers, block_matmul_params(model, False), V, h))
    total_params = total[0](*total[1])
    return {"total": total, "embedding": embedding, "matmul_per_token": matmul,
            "active": (ACTIVE, (total_params, n_moe, model.n_experts, model.top_k, expert_params(model))),
            "non_embedding": (NON_EMBEDDING, (total_params, embedding_params))}


def _moe_block(model: ModelSpec, experts: int) -> int:
    """One MoE block with ``experts`` routed experts, its router and shared expert; 0 for a dense model."""
    return _sum(block_tensors(model, True), experts) if model.is_moe else 0


def _head(model: ModelSpec) -> int:
    """The LM head's parameters: V·h when untied, else 0 (the embedding)."""
    return 0 if model.tied_embeddings else model.vocab_size * model.d_model


Layout = tuple[tuple[int, ...], bool]  # (every stage's layer count in model order, or () for equal stages; V-shaped)


def layout(model: ModelSpec, plan: ParallelPlan) -> Layout:
    """How ``plan`` places the layers, as ``stage_layers`` takes it: the stages' counts when the plan gives its own
    (``contract.stages``; () when the stages are equal, so that even plans share the caches) and whether the
    schedule places its two chunks a rank in a V."""
    counts = stage_layer_counts(model.n_layers, plan) if plan.pp > 1 and is_uneven(plan) else None
    return tuple(counts or ()), plan.pp > 1 and plan.pipeline_schedule in V_SCHEDULES


def stage_layers(model: ModelSpec, pp: int, virtual_stages: int, stage: int, counts: tuple[int, ...] = (),
                 v_shape: bool = False) -> list[int]:
    """Layer indices on pipeline rank ``stage``: its chunks are stages j·p + stage (looped) or stage and 2p−1−stage
    (``v_shape``), each of L/(p·v) layers, or of the stage's own count in ``counts`` (every stage's, in model
    order: an uneven layout)."""
    v = max(1, virtual_stages) if pp > 1 else 1
    ids = [stage, 2 * pp - 1 - stage] if v_shape and v == 2 else [j * pp + stage for j in range(v)]
    if not counts:
        counts = (model.n_layers // (pp * v),) * (pp * v)
    layers: list[int] = []
    for i in ids:
        start = sum(counts[:i])
        layers.extend(range(start, start + counts[i]))
    return layers


def local_numel(t: ParamTensor, tp: int, tp_rank: int, shard: int, shard_rank: int) -> int:
    """Elements of tensor ``t`` on one rank: tensor-parallel chunk, then dim-0 chunk over ``shard`` ranks."""
    rows, cols = t.rows, t.cols
    if t.tp_dim == 0:
        rows = chunk(rows, tp, tp_rank)
    elif t.tp_dim == 1:
        cols = chunk(cols, tp, tp_rank)
    return chunk(rows, shard, shard_rank) * cols


@lru_cache(maxsize=65536)
def rank_params(model: ModelSpec, tp: int, pp: int, virtual_stages: int, stage: int, ep: int = 1,
                shard: int = 1, tp_rank: int = 0, shard_rank: int = 0, last: bool | None = None,
                counts: tuple[int, ...] = (), v_shape: bool = False) -> int:
    """Parameters stored on one rank (pipeline ``stage``, tensor rank, dim-0 shard of ``shard`` ranks).

    Experts: n_experts/ep per rank. ``shard`` > 1 is FSDP / ZeRO-3 style per-tensor sharding (native engine).
    ``last``: whether the rank holds the final LayerNorm and head (default: the last rank; a V-shaped schedule
    puts them on the first). ``counts``, ``v_shape``: the plan's layout (``layout``; equal stages by default).
    """
    parts = rank_param_parts(model, tp, pp, virtual_stages, stage, ep, shard, tp_rank, shard_rank, last, counts,
                             v_shape)
    return RANK(*(parts[name] for name in RANK.params.split()))


def rank_param_parts(model: ModelSpec, tp: int, pp: int, virtual_stages: int, stage: int, ep: int = 1,
                     shard: int = 1, tp_rank: int = 0, shard_rank: int = 0, last: bool | None = None,
                     counts: tuple[int, ...] = (), v_shape: bool = False) -> dict[str, int]:
    """``rank_params`` by part: the stage's dense and MoE layers, one block's share on this rank of each (E/ep
    experts and the whole router in an MoE block), the embeddings (first stage) and the final LayerNorm + head
    (last stage; 0 elsewhere)."""
    layers = stage_layers(model, pp, virtual_stages, stage, counts, v_shape)
    n_moe = sum(1 for i in layers if model.is_moe_layer(i))
    experts_local = model.n_experts // ep if model.is_moe else 0

    def size(tensors, expert_copies=1):
        return sum(local_numel(t, tp, tp_rank, shard, shard_rank) * (expert_copies if t.expert else 1)
                   for t in tensors)

    return {"n_dense_layers": len(layers) - n_moe, "dense_block": size(block_tensors(model, False)),
            "n_moe_layers": n_moe, "moe_block": size(block_tensors(model, True), experts_local) if n_moe else 0,
            "embedding": size(embedding_tensors(model)) if stage == 0 else 0,
            "final": size(final_tensors(model, pp > 1)) if (stage == pp - 1 if last is None else last) else 0}


def rank_expert_params(model: ModelSpec, pp: int, virtual_stages: int, stage: int, ep: int = 1,
                       counts: tuple[int, ...] = (), v_shape: bool = False) -> int:
    """Of ``rank_params``, the expert parameters (tp = 1: MoE models are not tensor-parallel): n_moe·(E/ep)·expert."""
    if not model.is_moe:
        return 0
    n_moe = sum(1 for i in stage_layers(model, pp, virtual_stages, stage, counts, v_shape) if model.is_moe_layer(i))
    return n_moe * (model.n_experts // ep) * expert_params(model)
