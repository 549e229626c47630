"""The model variants the suggestions compare: padded vocabularies, aligned widths, head counts that tensor
parallel can split, deeper or wider shapes of equal parameters, and the mixture-of-experts counterpart of equal
active FLOPs. Pure functions of the contract's ModelSpec."""
from __future__ import annotations

import math

from trainer.contract import ClusterSpec, ModelSpec
from trainer.contract.specs import default_ffn
from trainer.planner.estimate.flops import model_flops_per_token
from trainer.planner.estimate.params import count

# Megatron-LM pads the vocabulary to a multiple of make-vocab-size-divisible-by (128) × tensor-parallel degree.
VOCAB_MULTIPLE = 128
# 16-bit tensor cores: K walked in 128-byte slabs, so widths in multiples of 64 elements leave no partial slab.
WIDTH_MULTIPLE = 64
# A head dimension that is a multiple of 8 elements (16 bytes) keeps attention's matmuls aligned.
HEAD_DIM_MULTIPLE = 8


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def padded_vocab(model: ModelSpec, tp: int) -> int:
    """The vocabulary padded up to a multiple of 128·tp (50,257 → 50,304 at tp 1, 50,432 at tp 2, 51,200 at tp 8)."""
    return _round_up(model.vocab_size, VOCAB_MULTIPLE * tp)


def useful_tp_degrees(cluster: ClusterSpec) -> tuple[int, ...]:
    """Tensor-parallel degrees worth having: powers of two that fit in a node (tp stays on NVLink)."""
    out, t = [], 2
    while t <= cluster.gpus_per_node:
        if cluster.gpus_per_node % t == 0:
            out.append(t)
        t *= 2
    return tuple(out)


def tp_degrees_allowed(model: ModelSpec, degrees: tuple[int, ...]) -> tuple[int, ...]:
    """Those of ``degrees`` that divide the heads, the KV heads and the FFN (the contract's rule)."""
    return tuple(t for t in degrees if model.n_heads % t == 0 and model.kv_heads % t == 0 and model.ffn % t == 0)


def _with_width(model: ModelSpec, d_model: int, n_heads: int) -> ModelSpec:
    """``model`` at another width and head count, keeping the FFN ratio (an explicit FFN scaled, rounded to 64) and
    the query-to-KV-head ratio where it divides."""
    ffn = 0
    if model.ffn_hidden:
        ffn = max(WIDTH_MULTIPLE, round(model.ffn_hidden * d_model / model.d_model / WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
    kv = 0
    if model.n_kv_heads and model.n_kv_heads != model.n_heads:
        group = model.n_heads // model.n_kv_heads
        kv = n_heads // group if n_heads % group == 0 else 0
    return model.replace(d_model=d_model, n_heads=n_heads, n_kv_heads=kv, ffn_hidden=ffn)


def aligned_width(model: ModelSpec, tp: int) -> ModelSpec | None:
    """The nearest widths that are tile multiples: d_model a multiple of 64 (heads kept when they still divide it),
    the FFN a multiple of 64·tp (a default FFN follows d_model); None when both already are."""
    h, step = model.d_model, WIDTH_MULTIPLE * tp
    new_h = h if h % WIDTH_MULTIPLE == 0 else max(WIDTH_MULTIPLE, round(h / WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
    default = default_ffn(new_h, model.is_gated)
    f = model.ffn_hidden or default
    new_f = f if f % step == 0 else max(step, round(f / step) * step)
    if (new_h, new_f) == (h, model.ffn):
        return None
    heads = model.n_heads if new_h % model.n_heads == 0 else _closest_heads(new_h, model.n_heads, tp)
    if heads is None:
        return None
    out = _with_width(model, new_h, heads)
    return out.replace(ffn_hidden=0 if new_f == default else new_f)


def _closest_heads(d_model: int, heads: int, multiple: int) -> int | None:
    """The head count nearest ``heads`` (in ratio) that divides d_model, is a multiple of ``multiple`` and leaves a
    head_dim that is a multiple of 8; head dims that are multiples of 64 win ties."""
    best, best_key = None, None
    for a in range(multiple, d_model + 1, multiple):
        if d_model % a or (d_model // a) % HEAD_DIM_MULTIPLE:
            continue
        key = (abs(math.log(a / heads)), (d_model // a) % WIDTH_MULTIPLE != 0)
        if best_key is None or key < best_key:
            best, best_key = a, key
    return best


def heads_for_tp(model: ModelSpec, cluster: ClusterSpec) -> ModelSpec | None:
    """Head and KV-head counts (and FFN) that every useful tp degree divides, at the same d_model; None when they
    already do, or no head count of d_model can."""
    degrees = useful_tp_degrees(cluster)
    if not degrees or tp_degrees_allowed(model, degrees) == degrees:
        return None
    top = degrees[-1]
    heads = model.n_heads if model.n_heads % top == 0 else _closest_heads(model.d_model, model.n_heads, top)
    if heads is None:
        return None
    kv = 0
    if model.kv_heads != model.n_heads:
        kv = min((d for d in range(top, heads + 1, top) if heads % d == 0),
                 key=lambda d: abs(math.log(d / model.kv_heads)))
    ffn = model.ffn if model.ffn % top == 0 else _round_up(model.ffn, WIDTH_MULTIPLE * top)
    return model.replace(n_heads=heads, n_kv_heads=kv, ffn_hidden=0 if ffn == 4 * model.d_model else ffn)


def equal_parameter_shapes(model: ModelSpec, depth_factors: tuple[float, ...] = (0.5, 2.0)) -> list[ModelSpec]:
    """Deeper-and-narrower and shallower-and-wider shapes with the parameter count nearest the model's: n_layers
    scaled by each factor, head_dim kept, the head count (hence d_model) chosen to match the total parameters."""
    total = count(model).total
    hd = model.head_dim
    group = model.n_heads // model.kv_heads
    out = []
    for factor in depth_factors:
        layers = round(model.n_layers * factor)
        if layers < 1 or layers == model.n_layers:
            continue
        guess = model.n_heads * math.sqrt(model.n_layers / layers)
        candidates = [a for a in range(max(group, int(guess * 0.5)), int(guess * 1.6) + group + 1) if a % group == 0]
        shapes = [_with_width(model.replace(n_layers=layers, moe_every=min(model.moe_every, layers)), a * hd, a)
                  for a in candidates]
        shapes = [s for s in shapes if not s.problems()]
        if shapes:
            out.append(min(shapes, key=lambda s: abs(count(s).total - total)))
    return out


def moe_counterpart(model: ModelSpec, experts: int = 16, top_k: int = 1) -> ModelSpec | None:
    """The other side of the dense/MoE comparison at exactly equal active FLOPs (``flops.model_flops_per_token``).

    Dense → MoE: every MLP becomes E experts, k per token (the model has one FFN width for all its blocks, so every
    block is an MoE block). A token multiplies by 2·h·f in a dense MLP and by h·E (router) + k·2·h·f_e in an MoE
    one, so f_e = (2f − E)/(2k); E = 16, k = 1 keeps f_e a multiple of 8 whenever f is. MoE → dense, with n of
    the L blocks MoE: f = f_e + n·(E + 2·(k − 1)·f_e)/(2L). None when the width does not come out whole."""
    if model.is_moe:
        L, n, f, k, E = model.n_layers, len(model.moe_layers), model.ffn, model.top_k, model.n_experts
        numerator = 2 * L * f + n * (E + 2 * (k - 1) * f)
        if numerator % (2 * L):
            return None
        other = model.replace(n_experts=0, ffn_hidden=numerator // (2 * L), moe_every=1)
    else:
        twice = 2 * model.ffn - experts
        if experts < 2 or not 1 <= top_k <= 2 or twice <= 0 or twice % (2 * top_k):
            return None
        other = model.replace(n_experts=experts, top_k=top_k, moe_every=1, ffn_hidden=twice // (2 * top_k))
    if other.problems() or model_flops_per_token(other) != model_flops_per_token(model):
        return None
    return other
