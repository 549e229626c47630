"""``estimate(model, plan, cluster)``: the planner's numbers as figures that carry their formulas.

The values come from ``core.Planner`` (the same arithmetic the auto-tuner ranks with); this module names each term,
writes the formula it came from and the inputs, and returns a JSON-serialisable ``Estimate``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainer.contract.schedules import ZERO_BUBBLE
from trainer.planner.estimate import flops as F
from trainer.planner.estimate import memory as M
from trainer.planner.estimate import params as P
from trainer.planner.estimate.comm import RING_GRAD_BYTES, ring_attention
from trainer.planner.estimate.core import GB, Planner, PlanNumbers, StageMemory, rank_of
from trainer.planner.estimate.numbers import IN_MICROBATCH
from trainer.planner.estimate.figure import Figure, fig, symbolic, total
from trainer.planner.estimate.kernel_time import Work
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError, check_plan

# Formulas of the named activation terms, per layer (a stage's figure is n_layers · the formula). T = s·b tokens per
# micro-batch, e bytes per activation element, e_stream those of the residual stream (fp32 under autocast), r = t with
# sequence parallel else 1, r_ln what the saved LayerNorm outputs are divided by (1 when sequence parallel keeps them
# gathered), ln_copies the saved LayerNorm outputs (2; under autocast one 16-bit cast per consuming matmul, 4).
# MoE layers (memory.moe_activations): cap = max(1, ⌈c·T·k/E⌉) slots per expert, M = min(T·k, E·min(cap, T)) kept
# assignments (exact when c ≥ E/k; an upper bound otherwise).
ACTIVATION_FORMULAS = {
    "layernorm_inputs": "2·T·h·e_norm / r  (e_norm = e_stream, or 4 for RMSNorm upcasting on the CPU)",
    "layernorm_outputs": "ln_copies·T·h·e / r_ln",
    "layernorm_stats": "2·2·T·stat_bytes / r  (mean and 1/σ of two LayerNorms)",
    "dropout_masks": "2·T·h·mask_bytes / r",
    "qkv": "T·(h + 2·kv_saved)·e / t  (kv_saved = h when keys and values are repeated to the heads, kv under cp)",
    "attention_output": "T·h·e / t",
    "rotary": "T·h·e / t  (rotated q, k)",
    "rotary_tables": "gathers·2·s·floor(head_dim/2)·table_bytes  (cos, sin; gathered for q and k apart under cp)",
    "attention_scores": "T·a·s·e / t  (softmax output)",
    "attention_dropout": "T·a·s·(mask_bytes + e) / t  (mask + dropped scores)",
    "causal_mask": "s²",
    "attention_logsumexp": "T·a·4 / t",
    "mlp": "2·T·f·e / t  (up-projection output, GELU output)",
    "swiglu": "4·T·f·e / t  (gate output, SiLU output, up output, their product)",
    "gate_input_cast": "T·h·e / r_ln  (autocast's cast of the norm output for SwiGLU's gate)",
    "rmsnorm_stats": "2·T·4 / r  (1/rms of two RMSNorms, fp32)",
    "rmsnorm_normalized": "2·T·h·4 / r  (fp32 x/rms before the gain: RMSNorm as separate operations, on the CPU)",
    "expert_gate_inputs": "E·cap·h·e  (each expert's gate's cast of its rows, under autocast)",
    "expert_swiglu": "4·E·cap·f_e·e  (each expert's gate, SiLU, up and product outputs)",
    "shared_expert": "mlp_saved·T·f_s·e  (the shared expert's MLP on every token)",
    "shared_expert_input_casts": "shared_casts·T·h·e  (the shared expert's and its gate's casts, under autocast)",
    "shared_expert_output": "T·h·e  (kept by the gate's multiply)",
    "shared_gate_small": "T·e  (the gate's sigmoid)",
    "router_probs": "T·E·4  (softmax output, fp32)",
    "dispatched_tokens": "M·h·e_stream  (index_copy keeps its gathered source)",
    "expert_inputs": "E·cap·h·e  (the dispatch buffer at capacity)",
    "expert_mlp": "2·E·cap·f_e·e  (each expert's up-projection and GELU outputs)",
    "combine": "2·M·h·e  (gathered expert outputs, gated outputs kept by index_add)",
    "routing_small": "T·k·8 + T·k + 2·M·8 + M·e + E·4  (top-k indices, kept mask, row/slot indices, gates, aux "
                     "fractions)",
    "layer_input": "T·h·e_stream / r  (full recompute keeps the layer input only)",
}
# with k > 1 the renormalisation of the top-k probabilities keeps T·k·4 + T·4 more
ROUTING_SMALL_TOP_K = ("T·k·8 + T·k + 2·M·8 + M·e + E·4 + T·k·4 + T·4  (top-k indices, kept mask, row/slot indices, "
                       "gates, aux fractions, renormalisation)")
# What the embedding (first stage) and the final LayerNorm, head and loss (last stage) save, once a stage.
EDGE_FORMULAS = {
    "token_ids": "T·8",
    "position_ids": "s·8",
    "embedding_dropout_mask": "T·h·mask_bytes / r",
    "final_layernorm_input": "T·h·e_norm / r",
    "final_layernorm_output": "T·h·e / r_ln",
    "final_layernorm_stats": "2·T·stat_bytes / r",
    "final_rmsnorm_stats": "T·4 / r",
    "final_rmsnorm_normalized": "T·h·4 / r",
    "log_probs": "T·⌈V/t⌉·loss_bytes",
    "targets": "T·8",
    "loss_scalars": "4",
}
BUFFER_FORMULAS = {
    "logits_and_grad": "2·T·⌈V/t⌉·loss_bytes  (the logits and their gradient)",
    "gathered_params": "2·(P_rank/layers)·e + (P_rank/layers)·grad_bytes  (two gathered layers + one gradient)",
    "ddp_buckets": "P_rank·grad_bytes  (DDP's flat gradient buckets)",
    "zero_buckets": "2·min(5e8, P_rank)·grad_bytes  (reduce + all-gather buckets of 5e8 elements)",
    "autocast_weight_copies": "2·P_rank  (16-bit casts of fp32 weights saved for backward)",
    "pipeline_p2p": "2·T·h·e / r  (send + receive)",
    "all_to_all": "2·T·k·c·h·e",
}


def _outer_sum(expr: str) -> bool:
    """Whether ``expr`` adds or subtracts outside any parenthesis."""
    depth = 0
    for ch in expr:
        if ch in "(⌈":
            depth += 1
        elif ch in ")⌉":
            depth -= 1
        elif depth == 0 and ch in "+−":
            return True
    return False


def _times(count: str, formula: str) -> str:
    """``count · formula``, the formula parenthesised when it is a sum; its note kept."""
    expr, _, note = formula.partition("  ")
    return f"{count} · " + (f"({expr})" if _outer_sum(expr) else expr) + (f"  {note}" if note else "")


def _layer_formula(name: str, top_k: int) -> str:
    if name == "routing_small" and top_k > 1:
        return ROUTING_SMALL_TOP_K
    return ACTIVATION_FORMULAS.get(name, name)


def _activation_symbols(model: ModelSpec, settings: M.ActivationSettings, cp: int) -> dict[str, float]:
    """The values of the symbols of the activation and buffer formulas, for ``settings``; ``model`` as a rank of
    ``cp`` sees it (``Planner.share``)."""
    T = model.seq_len * settings.micro_batch
    kv = model.kv_heads * model.head_dim
    symbols = dict(T=T, s=model.seq_len, b=settings.micro_batch, h=model.d_model, a=model.n_heads, f=model.ffn,
                   V=model.vocab_size, head_dim=model.head_dim, t=settings.tp, e=settings.bytes_per_element,
                   e_stream=settings.stream_bytes, r=settings.sp_split, r_ln=settings.ln_output_split,
                   ln_copies=settings.ln_output_copies, stat_bytes=settings.stat_bytes,
                   mask_bytes=settings.mask_bytes, loss_bytes=settings.loss_bytes,
                   table_bytes=settings.rotary_table_bytes,
                   kv_saved=kv if cp > 1 else settings.kv_saved(model.d_model, kv), gathers=2 if cp > 1 else 1,
                   e_norm=settings.norm_input_bytes(model.norm == "rmsnorm"))
    if model.is_moe:
        E, k, c = model.n_experts, model.top_k, model.capacity_factor
        # c = 0 (no token dropped) sizes the buffers and the all-to-all as c = E/k would
        symbols.update(E=E, k=k, c=M.routed_capacity_factor(model), cap=M.expert_capacity(T, E, k, c),
                       M=M.moe_kept(T, E, k, c),
                       f_e=model.moe_ffn, f_s=model.shared_expert_ffn, mlp_saved=4 if model.is_gated else 2,
                       shared_casts=(2 if model.is_gated else 1) + (1 if model.shared_expert_gate else 0))
    return symbols


@dataclass
class Estimate:
    model: ModelSpec
    plan: ParallelPlan
    cluster: ClusterSpec
    options: EstimateOptions
    parameters: dict[str, Figure]
    flops: dict[str, Figure]
    memory: dict[str, Any]
    time: dict[str, Figure]
    budget: dict[str, Figure] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    numbers: PlanNumbers | None = None

    @property
    def peak_memory_bytes(self) -> float:
        return self.memory["peak"].value

    @property
    def step_time_s(self) -> float:
        return self.time["step"].value

    @property
    def fits(self) -> bool:
        return self.memory["fits"]

    def to_dict(self) -> dict[str, Any]:
        def conv(x):
            if isinstance(x, Figure):
                return x.to_dict()
            if isinstance(x, dict):
                return {k: conv(v) for k, v in x.items()}
            if isinstance(x, list):
                return [conv(v) for v in x]
            return x
        return {"model": self.model.to_dict(), "plan": self.plan.to_dict(), "cluster": self.cluster.to_dict(),
                "options": self.options.to_dict(), "parameters": conv(self.parameters), "flops": conv(self.flops),
                "memory": conv(self.memory), "time": conv(self.time), "budget": conv(self.budget),
                "warnings": list(self.warnings)}


def validate_inputs(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> None:
    """Raise SpecError naming every problem of the three specs and of the plan against them."""
    for name, obj, cls in (("model", model, ModelSpec), ("plan", plan, ParallelPlan),
                           ("cluster", cluster, ClusterSpec)):
        if not isinstance(obj, cls):
            raise SpecError.single(name, f"expected a {cls.__name__}, got {type(obj).__name__}")
    problems: dict[str, list[str]] = {}
    for prefix, obj in (("model", model), ("plan", plan), ("cluster", cluster)):
        for key, messages in obj.problems().items():
            if messages:
                problems[f"{prefix}.{key}" if key else prefix] = messages
    if not problems:
        for key, messages in check_plan(model, plan, cluster).items():
            problems.setdefault(f"plan.{key}" if key else "plan", []).extend(messages)
    if problems:
        raise SpecError(problems)


def _gb(x: float) -> str:
    return f"{x / GB:.3f} GB"


def _parameters(planner: Planner, numbers: PlanNumbers) -> dict[str, Figure]:
    m, c, plan = planner.model, planner.counts, numbers.plan
    h, L, V, s = m.d_model, m.n_layers, m.vocab_size, m.seq_len
    n_moe = len(m.moe_layers) if m.is_moe else 0
    layers = "n_dense_layers·per_dense_block + n_moe_layers·per_moe_block" if m.is_moe else "n_layers·per_dense_block"
    out = {
        "total": fig(c.total, "parameters", f"{layers} + embedding + final_layernorm + head  (a tied head is the "
                     "embedding, counted once: head 0)", n_layers=L, n_dense_layers=L - n_moe, n_moe_layers=n_moe,
                     per_dense_block=c.per_dense_block, per_moe_block=c.per_moe_block, embedding=c.embedding,
                     final_layernorm=P.final_layernorm_params(m), head=c.head, vocab_size=V, d_model=h, seq_len=s,
                     block_formula="12h² + 13h for f = 4h, kv = h, biases (docs/formulas.md, Parameters)"),
        "embedding": fig(c.embedding, "parameters", "V·h + s·h  (tokens, learned positions)"
                         if m.positions == "learned" else "V·h", V=V, h=h, s=s),
        "non_embedding": fig(c.non_embedding, "parameters", "total − embedding", total=c.total, embedding=c.embedding),
        "matmul_per_token": fig(c.matmul_per_token, "parameters",
                                ("n_dense_layers·dense_block_matmul + n_moe_layers·moe_block_matmul + V·h  (the "
                                 "router and k of E experts in an MoE block; " if m.is_moe else
                                 "n_layers·dense_block_matmul + V·h  (") + "block weight matrices and the head, "
                                "tied or not; not embeddings, biases or LayerNorms)",
                                n_layers=L, n_dense_layers=L - n_moe, n_moe_layers=n_moe,
                                dense_block_matmul=P.block_matmul_params(m, False),
                                moe_block_matmul=P.block_matmul_params(m, True), V=V, h=h),
    }
    if m.is_moe:
        out["active"] = fig(c.active, "parameters", "total − n_moe_layers·(E − k)·expert  (k of E experts per MoE "
                            "layer)", total=c.total, n_moe_layers=n_moe, E=m.n_experts, k=m.top_k,
                            expert=P.expert_params(m))
    counts, v_shape = planner.layout(plan)
    for st in numbers.stages:
        parts = P.rank_param_parts(m, plan.tp, plan.pp, plan.model_chunks, st.stage, plan.ep,
                                   last=M.holds_last_stage(plan, st.stage), counts=counts, v_shape=v_shape)
        named = [f"{n}·{b}" for n, b in (("n_dense_layers", "dense_block"), ("n_moe_layers", "moe_block"))
                 if parts[n]] + [n for n in ("embedding", "final") if parts[n]]
        out[f"stage_{st.stage}_rank"] = fig(
            st.params, "parameters", " + ".join(named or ["0"]) + "  (one block's share on tensor rank 0, split as "
            "torch.chunk does, biases of row-parallel layers and LayerNorms replicated; an MoE block holds E/ep "
            "experts and the whole router; embeddings on the first stage, final LayerNorm + head on the last; a "
            "tied head on a pipeline's last stage is a copy)", **parts, stage=st.stage, tp=plan.tp, pp=plan.pp,
            ep=plan.ep)
    return out


def _flops(planner: Planner, numbers: PlanNumbers) -> dict[str, Figure]:
    m, plan = planner.model, numbers.plan
    B, L, h, s, V = plan.global_batch, m.n_layers, m.d_model, m.seq_len, m.vocab_size
    tokens = B * s
    N = planner.counts.matmul_per_token
    per_token = fig(planner.model_flops_per_token, "FLOP/token", "6·N + 12·L·h·s  (PaLM appendix B)",
                    N=N, L=L, h=h, s=s)
    ckpt = plan.activation_checkpointing
    recompute = fig(planner.recompute_flops[ckpt], "FLOP/token",
                    {"full": "2·N_blocks + 4·L·h·s  (full recompute: the blocks' forward again)",
                     "selective": "4·L·h·s  (selective recompute: the attention core's forward again)",
                     "none": "0  (no recompute)"}[ckpt],
                    checkpointing=ckpt, N_blocks=N - V * h, L=L, h=h, s=s)
    hw = fig(per_token.value + recompute.value, "FLOP/token", "model + recompute", model=per_token,
             recompute=recompute)
    out = {"model_per_token": per_token, "hardware_per_token": hw,
           "model_per_step": fig(numbers.model_flops_per_step, "FLOP", "model_per_token · B·s",
                                 model_per_token=per_token.value, B=B, s=s, tokens=tokens),
           "hardware_per_step": fig(numbers.hardware_flops_per_step, "FLOP", "hardware_per_token · B·s",
                                    hardware_per_token=hw.value, B=B, s=s, tokens=tokens)}
    if not m.is_moe and m.ffn == 4 * m.d_model and m.kv_heads == m.n_heads:
        full = ckpt == "full"
        out["narayanan_check"] = fig(F.narayanan_flops_per_step(m, B, full), "FLOP",
                                     "96·B·s·L·h²·(1 + s/(6·h) + V/(16·L·h))" if full else
                                     "72·B·s·L·h²·(1 + s/(6·h) + V/(12·h·L))", B=B, s=s, L=L, h=h, V=V,
                                     note="Narayanan et al. 2021 eq. 3: equals model_per_step without recompute "
                                          "and hardware_per_step with full recompute (N = 12·L·h² + V·h)")
    return out


def _in_flight_formula(plan: ParallelPlan) -> str:
    if plan.pp <= 1:
        return "1  (no pipeline: each micro-batch is freed after its backward)"
    if plan.pipeline_schedule == "gpipe":
        return "m  (GPipe: every micro-batch)"
    if plan.pipeline_schedule == "interleaved":
        return "min(m, (p − stage) + (p − 1)/v)  (interleaved 1F1B, Korthikanti 2022)"
    if plan.pipeline_schedule == "dualpipev":
        return "min(m, p + 1/2)  (dualpipev: every rank, weight backward deferred)"
    if plan.pipeline_schedule in ZERO_BUBBLE:
        return f"min(m, p)  ({plan.pipeline_schedule}: every rank, weight backward deferred)"
    return "min(m, p − stage)  (1F1B)"


def _embedding_gradient_view(planner: Planner, plan: ParallelPlan, stage: int) -> bool:
    """The native trainer's vocabulary-split embedding that is not also the head keeps a full V×h gradient of
    which its 1/t view is used (measured; core.Planner.stage_memory adds it)."""
    m = planner.model
    return (stage == 0 and plan.tp > 1 and plan.engine == "native" and plan.zero_stage < 3
            and (plan.pp > 1 or not m.tied_embeddings))


def _stage_figures(planner: Planner, plan: ParallelPlan, st: StageMemory) -> dict[str, Any]:
    m = planner.model
    per = M.state_bytes_per_param(plan.precision, plan.engine, plan.zero_stage)
    g_bytes = M.state_bytes_per_param(plan.precision, plan.engine).gradients
    shard_w = "P_shard" if plan.zero_stage >= 3 else "P_rank"
    shard_g = "P_shard" if plan.zero_stage >= 2 else "P_rank"
    shard_o = "P_shard" if plan.zero_stage >= 1 else "P_rank"
    terms = dict(P_rank=st.params, P_shard=st.params_sharded, zero_stage=plan.zero_stage, dp=plan.dp * plan.cp)
    gradients = f"{per.gradients}·{shard_g}"
    if _embedding_gradient_view(planner, plan, st.stage):
        gradients += (f" + (V − ⌈V/t⌉)·h·{g_bytes}  (the vocabulary-split embedding's gradient is a 1/t view of a "
                      "full V×h gradient, which stays allocated)")
        terms_g = dict(terms, V=m.vocab_size, h=m.d_model, t=plan.tp)
    else:
        terms_g = terms
    states = {
        "weights": fig(st.states["weights"], "bytes", f"0  (offloaded: {per.weights}·{shard_w} in host memory)"
                       if plan.offload_params else f"{per.weights}·{shard_w}", **terms),
        "gradients": fig(st.states["gradients"], "bytes", gradients, **terms_g),
        "optimizer": fig(st.states["optimizer"], "bytes", f"0  (offloaded: {per.optimizer}·{shard_o} in host "
                         "memory)" if plan.offload_optimizer else f"{per.optimizer}·{shard_o}", **terms),
    }
    settings = planner.activation_settings(plan)
    symbols = _activation_symbols(planner.share(plan.cp), settings, plan.cp)  # a rank's s/cp positions under cp
    common = dict(s=m.seq_len // plan.cp, b=plan.micro_batch, h=m.d_model, a=m.n_heads, t=plan.tp,
                  e=settings.bytes_per_element, layers=st.layers, sequence_parallel=plan.sequence_parallel,
                  checkpointing=plan.activation_checkpointing)
    if m.is_moe:
        common.update({n: symbols[n] for n in ("E", "k", "c", "cap", "M")}, f=m.ffn, moe_layers=len(m.moe_layers))
    held = planner.rank_layers(plan, st.stage)
    n_moe = sum(1 for i in held if m.is_moe_layer(i))
    counts = {False: ("n_dense_layers" if m.is_moe else "n_layers", st.layers - n_moe), True: ("n_moe_layers", n_moe)}
    top_k = m.top_k if m.is_moe and m.renormalizes_topk else 1  # the routing formula with renormalisation or not
    per_mb = {}
    for name, value in st.activations_per_microbatch.items():
        if name in EDGE_FORMULAS:
            per_mb[name] = symbolic(value, "bytes", EDGE_FORMULAS[name], symbols)
            continue
        moe_layer = name.startswith("moe_")
        count_name, n = counts[moe_layer]
        per_mb[name] = symbolic(value, "bytes", _times(count_name, _layer_formula(name.removeprefix("moe_"), top_k)),
                                {**symbols, count_name: n})
    per_mb_total = total("bytes", per_mb)
    per_mb_total.terms.update(common)
    activations = fig(st.activations, "bytes", "in_flight · activations_per_microbatch",
                      in_flight=fig(st.in_flight, "micro-batches", _in_flight_formula(plan),
                                    schedule=plan.pipeline_schedule, p=plan.pp, m=plan.grad_accum,
                                    v=plan.virtual_stages, stage=st.stage),
                      activations_per_microbatch=per_mb_total)
    buffer_symbols = {**symbols, "P_rank": st.params, "layers": st.layers, "grad_bytes": g_bytes}
    buffers = {}
    for name, value in st.buffers.items():
        if name == "recompute_working_set":
            # the backward of a recomputed layer re-creates that layer's activations without recompute
            whole = planner.activation_settings(plan, "none")
            whole_symbols = _activation_symbols(planner.share(plan.cp), whole, plan.cp)
            layer = {n: symbolic(v, "bytes", _layer_formula(n, top_k), whole_symbols)
                     for n, v in M.layer_activations(planner.layer_shape(m.is_moe, plan.cp), whole)}
            buffers[name] = total("bytes", layer, " + ".join(layer) + "  (one layer's activations without "
                                  "recompute, re-created by the backward of a recomputed layer)")
        else:
            buffers[name] = symbolic(value, "bytes", BUFFER_FORMULAS.get(name, name), buffer_symbols)
    buffers = total("bytes", buffers)
    overhead = total("bytes", {name: _overhead_figure(name, band, planner, activations.value + buffers.value)
                               for name, band in st.overheads.items()})
    parts = {**states, "activations": activations, "buffers": buffers, "overhead": overhead}
    return {"stage": st.stage, "rank": rank_of(plan, st.stage), "layers": _runs(held), **parts,
            "activations_per_microbatch": per_mb_total,
            "total": total("bytes", parts), "host_bytes": st.states["host"],
            "band": st.band.to_dict()}


def _overhead_figure(name: str, band: M.Band, planner: Planner, dynamic: float) -> Figure:
    """One named overhead as expected, with its range in the formula's note."""
    if name == "fragmentation":
        expected, high = planner.fragmentation
        return fig(band.expected, "bytes", "fragmentation · dynamic  (the most: fragmentation_high · dynamic; "
                   "dynamic = activations + buffers)", fragmentation=expected, fragmentation_high=high,
                   dynamic=dynamic)
    return fig(band.expected, "bytes", f"expected  ({band.low / M.GIB:.2f} to {band.high / M.GIB:.2f} GiB)",
               expected=band.expected)


def _runs(layers: list[int]) -> list[list[int]]:
    """Layer indices as [first, last] runs of consecutive layers: a rank's model chunks."""
    out: list[list[int]] = []
    for i in layers:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _ring_figure(planner: Planner, plan: ParallelPlan, T: int, e: int, numbers: PlanNumbers) -> Figure:
    """One layer's ring attention for one micro-batch: the seconds of its hops that the attention they overlap
    does not hide (comm.ring_attention)."""
    m = planner.model
    kv, bw = m.kv_heads * m.head_dim, numbers.bandwidths["cp"]
    flops = planner.peak_flops * numbers.efficiency
    full = plan.activation_checkpointing == "full"
    ring = ring_attention(T, m.d_model, kv, plan.tp, plan.cp, e, bw, flops, full)
    a = fig(2 * T * T * (m.d_model / plan.tp) / flops, "s", "2·T²·(h/t) / (peak_flops · efficiency)  (a half-block "
            "of attention, q kᵀ and p v over T × T/2 pairs)", T=T, h=m.d_model, t=plan.tp,
            peak_flops=planner.peak_flops, efficiency=numbers.efficiency)
    return fig(ring.exposed_s, "s", "forwards·(cp − 1)·max(0, S_kv/bw − a) + (cp − 1)·max(0, (S_kv + S_grad)/bw − 2·a) "
               "+ S_grad/bw  (cp − 1 forward hops of K and V; backward, cp − 1 more beside cp hops of the fp32 "
               "gradient accumulators, the last one home hidden by nothing; the forward ring twice with full "
               "recompute)", forwards=2 if full else 1, cp=plan.cp, S_kv=2 * T * kv / plan.tp * e,
               S_grad=2 * T * kv / plan.tp * RING_GRAD_BYTES, bw=bw, a=a)


def _work(work: Work, what: str) -> Figure:
    return fig(work.seconds, "s", f"gemm + attention + elementwise  ({what}: GEMMs, the attention core, the kernels "
               "that stream activations)", gemm=work.gemm, attention=work.attention, elementwise=work.elementwise)


def _kernel_figures(planner: Planner, plan: ParallelPlan) -> dict[str, Figure]:
    """A micro-batch's layer kinds and head, kernel by kernel (``kernel_time``)."""
    out: dict[str, Figure] = {}
    for name, moe in (("dense_layer_s", False), ("moe_layer_s", True)):
        if moe and not planner.model.is_moe:
            continue
        w = planner.layer_work(plan, moe)
        out[name] = total("s", {"forward": _work(w.forward, "forward"), "backward": _work(w.backward, "backward"),
                                "recompute": _work(w.recompute, f"recompute ({plan.activation_checkpointing})")})
    if planner.pace(plan)[1]:   # the pacing rank holds the head
        out["head_s"] = _work(planner.head_work(plan), "output norm, head and loss")
    return out


def _term_figure(used: dict[str, tuple], name: str, unit: str, shown: dict[str, Any] | None = None) -> Figure:
    """A figure of the step-time term ``name`` took: its value, its formula and its numbers (``shown`` puts figures
    in place of some)."""
    term, args = used[name]
    values = term.values(args)
    return symbolic(term.function(*args), unit, term.formula,
                    {**values, **{k: v for k, v in (shown or {}).items() if k in values}})


# which collective group a part's bandwidth and latency are those of
GROUPS = {"tensor_parallel": "tp", "pipeline_p2p": "pp", "data_parallel": "dp", "expert_all_to_all": "ep",
          "context_parallel": "cp"}


def _time(planner: Planner, numbers: PlanNumbers) -> dict[str, Figure]:
    plan, m = numbers.plan, planner.model
    time, used = numbers.time, numbers.step_time.terms
    # numbers that are figures of their own: the compute's efficiency, the kernels, the ring, the bubble, latencies
    shown: dict[str, Any] = {"efficiency": _term_figure(used, "efficiency", "fraction")}
    if planner.clock:
        shown.update(_kernel_figures(planner, plan))
    if "context_parallel" in time:
        e = M.activation_bytes_per_element(plan.precision)
        shown["ring_exposed_s"] = _ring_figure(planner, plan, m.seq_len // plan.cp * plan.micro_batch, e, numbers)
    if "pipeline_bubble" in time:
        shown["bubble"] = _term_figure(used, "bubble", "fraction")
        work = {k: time[k] for k in IN_MICROBATCH if k in time}
        shown["microbatch_work_s"] = fig(sum(work.values()), "s", " + ".join(work) + "  (a micro-batch's work: what "
                                         "the bubble stretches)", **work)
    terms = {}
    for name, value in time.items():
        own = dict(shown)
        extra: dict[str, Any] = {}
        group = GROUPS.get(name)
        if group:
            own["latency_s"] = _term_figure(used, f"latency_{group}", "s")
            extra = dict(micro_batches=plan.grad_accum, collectives=numbers.collectives.get(group, 0.0),
                         latency_hops=numbers.latency_hops.get(group, 0.0),
                         bandwidth_rule="intra-node if group size × stride ≤ gpus_per_node, else inter-node "
                                        "(a ring collective's: × its ranks on a node, at most intra-node); "
                                        "× comm_efficiency")
        if name == "compute":
            pace_rank = planner.pace(plan)[0]
            extra = dict(hardware_flops_per_step=numbers.hardware_flops_per_step, gpus=plan.world_size,
                         pace_rank=pace_rank)
        terms[name] = _term_figure(used, name, "s", own)
        terms[name].terms.update(extra)
    step = total("s", terms)
    tokens = plan.global_batch * m.seq_len
    gpus, peak, peak_tflops = plan.world_size, planner.peak_flops, planner.cluster.gpu.peak_tflops
    return {
        "step": step,
        "tokens_per_s": fig(tokens / step.value, "tokens/s", "B·s / step", B=plan.global_batch, s=m.seq_len,
                            step=step.value),
        "mfu": fig(F.mfu(numbers.model_flops_per_step, step.value, peak_tflops, gpus), "fraction",
                   "model_flops_per_step / (step · gpus · peak_flops)",
                   model_flops_per_step=numbers.model_flops_per_step, step=step.value, peak_flops=peak, gpus=gpus,
                   peak_name="dense bf16 (datasheet)"),
        "hfu": fig(F.mfu(numbers.hardware_flops_per_step, step.value, peak_tflops, gpus), "fraction",
                   "hardware_flops_per_step / (step · gpus · peak_flops)",
                   hardware_flops_per_step=numbers.hardware_flops_per_step, step=step.value, peak_flops=peak,
                   gpus=gpus),
    }


def _budget(cluster: ClusterSpec, plan: ParallelPlan, model: ModelSpec, step_s: float, tokens: float):
    per_step = plan.global_batch * model.seq_len
    steps = math.ceil(tokens / per_step)
    seconds = steps * step_s
    hours = seconds * plan.world_size / 3600
    return {"tokens": fig(tokens, "tokens", "token_budget  (requested)", token_budget=tokens),
            "steps": fig(steps, "steps", "⌈tokens / tokens_per_step⌉  (tokens_per_step = B·s)", tokens=tokens,
                         tokens_per_step=per_step),
            "time": fig(seconds, "s", "steps · step", steps=steps, step=step_s),
            "gpu_hours": fig(hours, "GPU·h", "time · gpus / 3600", time=seconds, gpus=plan.world_size),
            "cost": fig(hours * cluster.gpu_hour_cost, "currency", "gpu_hours · gpu_hour_cost", gpu_hours=hours,
                        gpu_hour_cost=cluster.gpu_hour_cost)}


def estimate(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, options: EstimateOptions | None = None,
             token_budget: float | None = None) -> Estimate:
    """Parameters, FLOPs, memory per GPU (peak and where), step time, MFU and, given tokens, time and cost."""
    validate_inputs(model, plan, cluster)
    options = (options or EstimateOptions()).validate()
    if token_budget is not None and not (isinstance(token_budget, (int, float)) and token_budget > 0):
        raise SpecError.single("token_budget", f"token_budget={token_budget!r} must be a positive number")
    planner = Planner(model, cluster, options)
    numbers = planner.evaluate(plan)
    stages = [_stage_figures(planner, plan, st) for st in numbers.stages]
    peak = max(stages, key=lambda st: st["total"].value)
    capacity = planner.capacity_bytes
    memory = {
        "stages": stages,
        "peak": fig(peak["total"].value, "bytes", ("max(" + ", ".join(f"stage_{st['stage']}" for st in stages)
                                                   + ")  (the largest stage total)") if len(stages) > 1 else
                    "stage_0  (the stage total)", stage=peak["stage"], rank=peak["rank"],
                    **{f"stage_{st['stage']}": st["total"].value for st in stages}),
        "peak_stage": peak["stage"], "peak_rank": peak["rank"],
        "capacity": fig(capacity, "bytes", "memory_gb · 1e9  (gpu.memory_gb)", memory_gb=cluster.gpu.memory_gb),
        "band": numbers.peak_band.to_dict(),
        "fits": numbers.fits,
        "rank_rule": "rank = ((stage·dp + d)·cp + c)·tp + j; the figures are for d = 0, c = 0, j = 0 (the largest "
                     "shards)",
    }
    time = _time(planner, numbers)
    warnings = []
    if not memory["fits"]:
        high = numbers.peak_band.high
        warnings.append(f"needs {_gb(peak['total'].value)} on rank {peak['rank']} (pipeline stage {peak['stage']}), "
                        f"{_gb(high)} at the most, but the {cluster.gpu.name} has {_gb(capacity)}")
    if plan.pp > 1 and plan.grad_accum < plan.pp:
        warnings.append(f"only m={plan.grad_accum} micro-batches for pp={plan.pp} stages: the bubble dominates")
    budget = _budget(cluster, plan, model, time["step"].value, token_budget) if token_budget else {}
    return Estimate(model, plan, cluster, options, _parameters(planner, numbers), _flops(planner, numbers), memory,
                    time, budget, warnings, numbers)
