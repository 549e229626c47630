"""Each suggestion: a small function of the asked-about model, plan and cluster that returns a ``Suggestion`` (or
None when it has nothing to say), with the figures before and after, the relative gain, the reason and its formula.

The figures are ``figures.Assessor``'s: the planner's estimate, with the compute term refined by the matmul
shapes. What each computes and why: docs/advice.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan
from trainer.planner.advice import shapes as S
from trainer.planner.advice.figures import GB, Assessor, Figures
from trainer.planner.estimate.gemms import shape_efficiency
from trainer.planner.advice.plans import plan_for, plan_problems
from trainer.planner.estimate.flops import MODEL_FLOPS_PER_TOKEN, model_flops_per_token
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.params_model import TOTAL
from trainer.planner.tune.space import divisors

# A change is recommended when it buys at least this much throughput and still fits.
RECOMMEND_GAIN = 0.005

COMPUTE_FORMULA = ("compute' = compute · E_shape(asked) / E_shape(variant); bubble follows compute; "
                   "step' = step − compute − bubble + compute' + bubble'")


@dataclass
class Context:
    model: ModelSpec
    plan: ParallelPlan
    cluster: ClusterSpec
    options: EstimateOptions
    assessor: Assessor
    base: Figures


@dataclass
class Suggestion:
    kind: str
    title: str
    before: Figures
    after: Figures
    reason: str
    formula: list[str]
    alternatives: list[Figures] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def gain(self) -> dict[str, float]:
        """after/before − 1 of each figure: negative step time and positive tokens/s are better."""
        b, a = self.before, self.after
        return {"step_time": a.step_time_s / b.step_time_s - 1, "tokens_per_s": a.tokens_per_s / b.tokens_per_s - 1,
                "mfu": a.mfu / b.mfu - 1 if b.mfu else 0.0,
                "peak_memory": a.peak_memory_bytes / b.peak_memory_bytes - 1 if b.peak_memory_bytes else 0.0}

    @property
    def recommended(self) -> bool:
        return self.after.fits and self.gain["tokens_per_s"] >= RECOMMEND_GAIN

    @property
    def change(self) -> dict[str, dict[str, Any]]:
        """Model and plan fields that differ between before and after."""
        out = {}
        for prefix, b, a in (("model", self.before.model, self.after.model), ("plan", self.before.plan,
                                                                                 self.after.plan)):
            for f in dataclasses.fields(b):
                if f.name != "name" and getattr(b, f.name) != getattr(a, f.name):
                    out[f"{prefix}.{f.name}"] = {"before": getattr(b, f.name), "after": getattr(a, f.name)}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title, "recommended": self.recommended, "change": self.change,
                "before": self.before.to_dict(), "after": self.after.to_dict(), "gain": self.gain,
                "reason": self.reason, "formula": list(self.formula),
                "alternatives": [{"change": Suggestion(self.kind, "", self.before, f, "", []).change, **f.to_dict()}
                                 for f in self.alternatives],
                **({"details": self.details} if self.details else {})}


def _best(candidates: list[Figures]) -> Figures | None:
    """The fastest per token of those that fit; the lightest if none fits."""
    fitting = [f for f in candidates if f.fits]
    if fitting:
        return max(fitting, key=lambda f: f.tokens_per_s)
    return min(candidates, key=lambda f: f.peak_memory_bytes) if candidates else None


def _judge(ctx: Context, model: ModelSpec) -> tuple[Figures | None, str]:
    """The variant's best figures under the asked-about plan (or the tuner's) and how its plan was chosen."""
    plans, how = plan_for(model, ctx.plan, ctx.cluster, ctx.options)
    return _best([ctx.assessor.figures(model, p) for p in plans]), how


def _times(before: Figures, after: Figures) -> str:
    return (f"step {before.step_time_s * 1e3:.2f} → {after.step_time_s * 1e3:.2f} ms, E_shape "
            f"{before.shape_efficiency:.3f} → {after.shape_efficiency:.3f}")


def vocab_padding(ctx: Context) -> Suggestion | None:
    m, t = ctx.model, ctx.plan.tp
    padded = S.padded_vocab(m, t)
    if padded == m.vocab_size:
        return None
    variant = m.replace(vocab_size=padded)
    after, how = _judge(ctx, variant)
    if after is None:
        return None
    head = [e for g, _, e in shape_efficiency(m, ctx.plan, ctx.assessor.tiles).gemms if g.name == "head.forward"]
    tile_note = (f"; the head's forward GEMM (T, ⌈V/t⌉ = {-(-m.vocab_size // t)}, h) runs at "
                 f"{head[0].total:.3f} of an aligned one (tile {head[0].tile:.4f}, alignment {head[0].alignment:g})"
                 if head else "")
    return Suggestion(
        "vocab_padding", f"Pad the vocabulary {m.vocab_size:,} → {padded:,}", ctx.base, after,
        f"the vocabulary is a dimension of the head's three GEMMs and of the embedding; {m.vocab_size:,} is not a "
        f"multiple of {S.VOCAB_MULTIPLE}·t = {S.VOCAB_MULTIPLE * t}, so each tensor-parallel shard of "
        f"{-(-m.vocab_size // t):,} rows leaves partial tiles and misaligned rows{tile_note}. The padded rows are "
        f"never a target; their logits train towards zero probability ({how})",
        [f"V' = ⌈V / (128·t)⌉ · 128·t = ⌈{m.vocab_size} / {S.VOCAB_MULTIPLE * t}⌉ · {S.VOCAB_MULTIPLE * t} = {padded}",
         "E_gemm = tile · K-slab · wave · alignment (docs/advice.md, The matmul-shape model)",
         COMPUTE_FORMULA, _times(ctx.base, after)])


def width_alignment(ctx: Context) -> Suggestion | None:
    m, t = ctx.model, ctx.plan.tp
    variant = S.aligned_width(m, t)
    if variant is None:
        return None
    after, how = _judge(ctx, variant)
    if after is None:
        return None
    return Suggestion(
        "width_alignment", f"Align the widths: d_model {m.d_model} → {variant.d_model}, FFN {m.ffn} → {variant.ffn}",
        ctx.base, after,
        f"16-bit tensor cores walk K in 128-byte slabs (64 elements) and need rows of whole 16-byte vectors; "
        f"d_model and the FFN per tensor-parallel rank (f/t = {m.ffn // t}) are the N and K of every block GEMM, "
        f"so widths that are multiples of 64 (the FFN of 64·t) leave no partial slab or tile ({how})",
        [f"d_model' = round(d_model / 64)·64 = {variant.d_model}",
         f"ffn' = round(ffn / (64·t))·64·t = {variant.ffn}  (t = {t})",
         f"parameters {ctx.base.parameters:,} → {after.parameters:,}", COMPUTE_FORMULA, _times(ctx.base, after)])


def heads_for_tensor_parallel(ctx: Context) -> Suggestion | None:
    m = ctx.model
    variant = S.heads_for_tp(m, ctx.cluster)
    if variant is None:
        return None
    degrees = S.useful_tp_degrees(ctx.cluster)
    plans, how = plan_for(variant, ctx.plan, ctx.cluster, ctx.options)
    candidates = [ctx.assessor.figures(variant, p) for p in plans]
    after = _best(candidates)
    if after is None:
        return None
    return Suggestion(
        "heads_for_tp", f"Heads {m.n_heads} → {variant.n_heads}"
                        + (f", KV heads {m.kv_heads} → {variant.kv_heads}" if m.kv_heads != m.n_heads else "")
                        + f": tensor parallel {'/'.join(map(str, degrees))} becomes possible",
        ctx.base, after,
        f"tensor parallel splits the heads, the KV heads and the FFN, so tp must divide all three; within a node of "
        f"{ctx.cluster.gpus_per_node} GPUs the degrees worth having are {list(degrees)}, of which "
        f"{list(S.tp_degrees_allowed(m, degrees)) or 'none'} divide this model and "
        f"{list(S.tp_degrees_allowed(variant, degrees))} divide the variant (head_dim {m.head_dim} → "
        f"{variant.head_dim}). The gain shown is under the asked-about plan; the point is the plans it opens "
        f"when the model grows or memory runs short ({how})",
        [f"allowed tp = {{t ∈ {list(degrees)} : t | n_heads, t | n_kv_heads, t | ffn}}",
         f"n_heads' = the count nearest {m.n_heads} that {degrees[-1]} divides, dividing d_model = {m.d_model} into "
         f"head dims that are multiples of 8", COMPUTE_FORMULA, _times(ctx.base, after)],
        details={"tp_allowed_before": list(S.tp_degrees_allowed(m, degrees)),
                 "tp_allowed_after": list(S.tp_degrees_allowed(variant, degrees))})


def depth_vs_width(ctx: Context) -> Suggestion | None:
    m = ctx.model
    alternatives = []
    hows = []
    for shape in S.equal_parameter_shapes(m):
        figures, how = _judge(ctx, shape)
        if figures is not None:
            alternatives.append(figures)
            hows.append(f"{shape.n_layers}×{shape.d_model}: {how}")
    after = _best(alternatives)
    if after is None:
        return None
    v = after.model
    return Suggestion(
        "depth_vs_width", f"Depth against width at equal parameters: {m.n_layers}×{m.d_model} → "
                          f"{v.n_layers}×{v.d_model} ({v.n_heads} heads)", ctx.base, after,
        "at (nearly) equal parameters the matmul FLOPs are equal, but the attention term 12·L·h·s grows with L·h "
        "∝ √L, a wider layer gives each GEMM more work per micro-batch (w = b·s·h/t fills the GPU: "
        "efficiency = η·w/(w + w½)) and fewer, larger kernels, while a deeper one pipelines into more stages; "
        "each shape's figures are the planner's under its plan (" + "; ".join(hows) + ")",
        [f"parameters = {TOTAL.expr.text()}  (h = heads·head_dim, head_dim kept; the heads chosen to match them)",
         f"parameters {ctx.base.parameters:,} → {after.parameters:,} "
         f"({after.parameters / ctx.base.parameters - 1:+.2%})",
         f"model FLOPs/token = {MODEL_FLOPS_PER_TOKEN.expr.text()}: {ctx.base.model_flops_per_token:,} → "
         f"{after.model_flops_per_token:,}",
         "efficiency = compute_efficiency · w/(w + w½), w = b·s·h/t", COMPUTE_FORMULA, _times(ctx.base, after)],
        alternatives=alternatives)


def moe_vs_dense(ctx: Context, experts: int = 16, top_k: int = 1) -> Suggestion | None:
    m = ctx.model
    other = S.moe_counterpart(m, experts, top_k)
    if other is None:
        return None
    after, how = _judge(ctx, other)
    if after is None:
        return None
    moe, dense = (other, m) if other.is_moe else (m, other)
    flops = model_flops_per_token(m)
    return Suggestion(
        "moe_vs_dense", (f"Mixture of experts ({moe.n_experts} experts, top-{moe.top_k}, FFN {moe.ffn}) against the "
                         f"dense model (FFN {dense.ffn}) at equal active FLOPs"), ctx.base, after,
        f"both do {flops:,} model FLOPs per token; the MoE model holds {moe.n_experts}× the MLP weights (memory), "
        f"runs its experts at capacity c = {moe.capacity_factor} (the empty slots are computed too: smaller, "
        f"padded GEMMs) and, with ep > 1, adds four all-to-alls a layer; what it buys is quality per FLOP, which "
        f"no step-time figure shows ({how})",
        ["dense → MoE: f_e = (2f − E)/(2k)  (router h·E + k·2·h·f_e = 2·h·f multiply-adds per token and layer)",
         "MoE → dense: f = f_e + n_moe·(E + 2·(k − 1)·f_e)/(2L)",
         f"model FLOPs/token (flops.model_flops_per_token): {model_flops_per_token(m):,} = "
         f"{model_flops_per_token(other):,}",
         f"parameters {ctx.base.parameters:,} → {after.parameters:,}",
         "expert GEMMs: E × (cap, f_e, h) with cap = ⌈c·T·k/E⌉; useful rows = min(T·k, E·cap)/(E·cap)",
         COMPUTE_FORMULA, _times(ctx.base, after)],
        details={"model_flops_per_token": {"dense": model_flops_per_token(dense), "moe": model_flops_per_token(moe)},
                 "dense": (ctx.base if other.is_moe else after).to_dict(),
                 "moe": (after if other.is_moe else ctx.base).to_dict()})


def micro_batch(ctx: Context) -> Suggestion | None:
    plan = ctx.plan
    per_rank = plan.global_batch // plan.dp
    options = [plan.replace(micro_batch=b) for b in divisors(per_rank) if b != plan.micro_batch and b <= 1024]
    alternatives = [ctx.assessor.figures(ctx.model, p) for p in options
                    if not plan_problems(ctx.model, p, ctx.cluster)]
    if not alternatives:
        return None
    after = _best([ctx.base] + alternatives)
    left = f"{_gb(ctx.base.memory_left_bytes)} left of {_gb(ctx.base.capacity_bytes)}"
    title = f"Micro-batch {plan.micro_batch} → {after.plan.micro_batch} ({left})" \
        if after.plan.micro_batch != plan.micro_batch else \
        f"Micro-batch {plan.micro_batch} is already the fastest that fits ({left})"
    return Suggestion(
        "micro_batch", title,
        ctx.base, after,
        "a larger micro-batch gives each GEMM more rows (efficiency = η·w/(w + w½), w = b·s·h/t; fewer, fuller "
        "waves) and fewer micro-batches per step, at the price of activations that grow with b; the pick is the "
        "fastest micro-batch whose peak still fits",
        ["m = B / (b·dp) micro-batches a step; activations ∝ b (× micro-batches in flight)",
         "efficiency = compute_efficiency · w/(w + w½), w = b·s·h/t", COMPUTE_FORMULA,
         f"peak {_gb(ctx.base.peak_memory_bytes)} → {_gb(after.peak_memory_bytes)}", _times(ctx.base, after)],
        alternatives=alternatives)


def sequence_length(ctx: Context) -> Suggestion | None:
    m, plan = ctx.model, ctx.plan
    tokens = plan.global_batch * m.seq_len
    alternatives = []
    for factor in (0.5, 2, 4, 8):
        s = int(m.seq_len * factor)
        if s < 1 or tokens % s or s > 1 << 20:
            continue
        batch = tokens // s
        b = max(1, min(plan.micro_batch * m.seq_len // s, batch // plan.dp))
        variant, p = m.replace(seq_len=s), plan.replace(global_batch=batch, micro_batch=b)
        if variant.problems() or plan_problems(variant, p, ctx.cluster):
            continue
        alternatives.append(ctx.assessor.figures(variant, p))
    fitting = [f for f in alternatives if f.fits and f.model.seq_len > m.seq_len]
    if not alternatives:
        return None
    after = max(fitting, key=lambda f: f.model.seq_len) if fitting else min(alternatives,
                                                                              key=lambda f: f.model.seq_len)
    return Suggestion(
        "sequence_length", f"Context {m.seq_len} → {after.model.seq_len} at the same {tokens:,} tokens a step"
                           + (" (the longest that fits)" if fitting else " (no longer context fits)"),
        ctx.base, after,
        "at equal tokens per step a longer context keeps the matmul FLOPs but adds attention work (12·L·h·s per "
        "token) and saved attention activations that grow with s; the memory left says how far the context can "
        "grow before the plan must change",
        ["B' = B·s/s' sequences, b' = b·s/s' (at least 1) a micro-batch",
         "model FLOPs/token = 6·N + 12·L·h·s", f"memory left {_gb(ctx.base.memory_left_bytes)}",
         COMPUTE_FORMULA, _times(ctx.base, after)],
        alternatives=alternatives)


def _gb(x: float) -> str:
    return f"{x / GB:.2f} GB"


SUGGESTIONS: tuple[Callable[[Context], Suggestion | None], ...] = (
    vocab_padding, width_alignment, heads_for_tensor_parallel, depth_vs_width, moe_vs_dense, micro_batch,
    sequence_length)
