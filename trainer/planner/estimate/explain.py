"""``estimate(model, plan, cluster)``: the planner's numbers as figures that carry their formulas.

The values come from ``core.Planner`` (the same arithmetic the auto-tuner ranks with); this module names each term,
writes the formula it came from and the inputs, and returns a JSON-serialisable ``Estimate``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainer.planner.estimate import flops as F
from trainer.planner.estimate import memory as M
from trainer.planner.estimate.core import GB, Planner, PlanNumbers, StageMemory, rank_of
from trainer.planner.estimate.figure import Figure, fig, total
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError, check_plan

# Formulas of the named terms (T = s·b tokens per micro-batch, e bytes per activation, r = t with sequence parallel).
ACTIVATION_FORMULAS = {
    "layernorm_inputs": "n_layers · 2·T·h·e / r",
    "layernorm_outputs": "n_layers · 2·T·h·e / r  (/1 when sequence parallel keeps the gathered outputs)",
    "layernorm_stats": "n_layers · 2·2·T·4 / r  (mean, 1/σ in fp32)",
    "dropout_masks": "n_layers · 2·T·h·mask_bytes / r",
    "qkv": "n_layers · T·(h + 2·kv)·e / t",
    "attention_output": "n_layers · T·h·e / t",
    "rotary": "n_layers · T·h·e / t  (rotated q, k)",
    "rotary_tables": "n_layers · 2·s·(head_dim/2)·4",
    "attention_scores": "n_layers · T·a·s·e / t  (softmax output)",
    "attention_dropout": "n_layers · T·a·s·(mask_bytes + e) / t  (mask + dropped scores)",
    "causal_mask": "n_layers · s² · 1",
    "attention_logsumexp": "n_layers · T·a·4 / t",
    "mlp": "n_layers · 2·T·f·e / t  (up-projection output, GELU output)",
    # MoE layers (memory.moe_activations): cap = max(1, ⌈c·T·k/E⌉) slots per expert, M = min(T·k, E·min(cap, T))
    # kept assignments (exact when c ≥ E/k; an upper bound otherwise)
    "router_probs": "n_moe_layers · T·E·4  (softmax output, fp32)",
    "dispatched_tokens": "n_moe_layers · M·h·e_stream  (index_copy keeps its gathered source)",
    "expert_inputs": "n_moe_layers · E·cap·h·e  (the dispatch buffer at capacity)",
    "expert_mlp": "n_moe_layers · 2·E·cap·f·e  (each expert's up-projection and GELU outputs)",
    "combine": "n_moe_layers · 2·M·h·e  (gathered expert outputs, gated outputs kept by index_add)",
    "routing_small": "n_moe_layers · (T·k·8 + T·k + 2·M·8 + M·e + E·4 [+ T·k·4 + T·4 when k > 1])  "
                     "(top-k indices, kept mask, row/slot indices, gates, aux fractions, renormalisation)",
    "layer_input": "n_layers · T·h·e / r  (full recompute keeps the layer input only)",
    "token_ids": "T·8",
    "position_ids": "s·8",
    "embedding_dropout_mask": "T·h·mask_bytes / r",
    "final_layernorm_input": "T·h·e / r",
    "final_layernorm_output": "T·h·e / r  (/1 when sequence parallel keeps the gathered output)",
    "final_layernorm_stats": "2·T·4 / r",
    "log_probs": "T·ceil(V/t)·loss_bytes",
    "targets": "T·8",
    "loss_scalars": "4",
}
BUFFER_FORMULAS = {
    "logits_and_grad": "2·T·ceil(V/t)·loss_bytes",
    "recompute_working_set": "one layer's activations without recompute",
    "gathered_params": "2·(P_rank/layers)·e + (P_rank/layers)·grad_bytes  (two gathered layers + one gradient)",
    "ddp_buckets": "P_rank·grad_bytes  (DDP's flat gradient buckets)",
    "zero_buckets": "2·min(5e8, P_rank)·grad_bytes",
    "autocast_weight_copies": "2·P_rank  (16-bit casts of fp32 weights saved for backward)",
    "pipeline_p2p": "2·T·h·e / r  (send + receive)",
    "all_to_all": "2·T·k·c·h·e",
}
TIME_FORMULAS = {
    "compute": "(B·s/dp) · (F_blocks/p + F_head) / t / (peak · efficiency)  (the last pipeline stage, with the "
               "head, is the slowest; = hardware_flops_per_step / (dp·t) / (peak · efficiency) at p = 1)",
    "tensor_parallel": "m · layers_per_stage · n_allreduce · 2·(t−1)/t · T·h·e / β_tp  (n = 4, 6 with full recompute)"
                       " + α · hops_tp,  hops_tp = m·(layers_per_stage·n + edges) · 2·(t−1)  "
                       "(edges 2; 1 with a pipeline)",
    "expert_all_to_all": "m · moe_layers · 4 · (ep−1)/ep · T·k·c·h·e / β_ep + α · m·moe_layers·4·(ep−1)",
    "pipeline_bubble": "(compute + tp + all-to-all) · (p−1)/(v·m)",
    "pipeline_p2p": "m · v · 2 · (T·h·e/r) / β_pp + α · m·v·2",
    "data_parallel": "(1 − overlap) · [ZeRO 0–2: 2·(d−1)/d · P_rank·grad_bytes / β_dp + α · buckets·2·(d−1);  "
                     "ZeRO-3: (2m)·(d−1)/d·P_rank·e/β_dp + (d−1)/d·P_rank·grad_bytes/β_dp "
                     "+ α · (m·(units + regathered) + units)·(d−1), units = layers_per_stage + v]",
    "offload": "bytes moved over PCIe / pcie_bandwidth + 16·P_shard / host_memory_bandwidth (CPU Adam)",
    "step_overhead": "options.step_overhead_s",
}


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
    m, c = planner.model, planner.counts
    h, L, V, s = m.d_model, m.n_layers, m.vocab_size, m.seq_len
    out = {
        "total": fig(c.total, "parameters", "L_dense·block + L_moe·(attention + E·expert + router) + V·h (+ s·h) "
                     "+ final LN (+ V·h untied head)", per_dense_block=c.per_dense_block,
                     per_moe_block=c.per_moe_block, n_layers=L, vocab_size=V, d_model=h, seq_len=s,
                     embedding=c.embedding, head=c.head,
                     block_formula="12h² + 13h for f = 4h, kv = h, biases (docs/formulas.md, Parameters)"),
        "embedding": fig(c.embedding, "parameters", "V·h (+ s·h learned positions)", V=V, h=h, s=s),
        "non_embedding": fig(c.non_embedding, "parameters", "total − embedding", total=c.total, embedding=c.embedding),
        "matmul_per_token": fig(c.matmul_per_token, "parameters", "block weight matrices (k of E experts) + V·h head"),
    }
    if m.is_moe:
        out["active"] = fig(c.active, "parameters", "total with k of E experts per MoE layer", top_k=m.top_k,
                            n_experts=m.n_experts)
    for st in numbers.stages:
        out[f"stage_{st.stage}_rank"] = fig(
            st.params, "parameters", "layers_on_stage·block/t (+ embeddings on the first stage, final LN + head on "
            "the last; a tied head on a pipeline's last stage is a copy; an MoE block holds E/ep experts and the "
            "whole router)", stage=st.stage, tp=numbers.plan.tp,
            pp=numbers.plan.pp, ep=numbers.plan.ep)
    return out


def _flops(planner: Planner, numbers: PlanNumbers) -> dict[str, Figure]:
    m, plan = planner.model, numbers.plan
    tokens = plan.global_batch * m.seq_len
    per_token = fig(planner.model_flops_per_token, "FLOP/token", "6·N + 12·L·h·s (PaLM appendix B)",
                    N=planner.counts.matmul_per_token, L=m.n_layers, h=m.d_model, s=m.seq_len)
    recompute = planner.recompute_flops[plan.activation_checkpointing]
    hw = fig(planner.model_flops_per_token + recompute, "FLOP/token", "model + recompute",
             model=per_token, recompute=fig(recompute, "FLOP/token", "full: 2·N_blocks + 4·L·h·s; selective: "
                                            "4·L·h·s; none: 0", checkpointing=plan.activation_checkpointing))
    out = {"model_per_token": per_token, "hardware_per_token": hw,
           "model_per_step": fig(numbers.model_flops_per_step, "FLOP", "model_per_token · B·s", tokens=tokens),
           "hardware_per_step": fig(numbers.hardware_flops_per_step, "FLOP", "hardware_per_token · B·s",
                                    tokens=tokens)}
    if not m.is_moe and m.ffn == 4 * m.d_model and m.kv_heads == m.n_heads:
        full = plan.activation_checkpointing == "full"
        out["narayanan_check"] = fig(F.narayanan_flops_per_step(m, plan.global_batch, full), "FLOP",
                                     "96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))" if full else
                                     "72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L))",
                                     note="Narayanan et al. 2021 eq. 3: equals model_per_step without recompute "
                                          "and hardware_per_step with full recompute (N = 12·L·h² + V·h)")
    return out


def _stage_figures(planner: Planner, plan: ParallelPlan, st: StageMemory) -> dict[str, Any]:
    per = M.state_bytes_per_param(plan.precision, plan.engine, plan.zero_stage)
    shard_w = "P_shard" if plan.zero_stage >= 3 else "P_rank"
    shard_g = "P_shard" if plan.zero_stage >= 2 else "P_rank"
    shard_o = "P_shard" if plan.zero_stage >= 1 else "P_rank"
    terms = dict(P_rank=st.params, P_shard=st.params_sharded, zero_stage=plan.zero_stage, dp=plan.dp)
    states = {
        "weights": fig(st.states["weights"], "bytes",
                       f"{per.weights}·{shard_w}" + (" (offloaded: 0)" if plan.offload_params else ""), **terms),
        "gradients": fig(st.states["gradients"], "bytes", f"{per.gradients}·{shard_g}", **terms),
        "optimizer": fig(st.states["optimizer"], "bytes", f"{per.optimizer}·{shard_o}" + (" (offloaded: 0)"
                                                                             if plan.offload_optimizer else ""),
                         **terms),
    }
    e = M.activation_bytes_per_element(plan.precision)
    common = dict(s=planner.model.seq_len, b=plan.micro_batch, h=planner.model.d_model, a=planner.model.n_heads,
                  t=plan.tp, e=e, layers=st.layers, sequence_parallel=plan.sequence_parallel,
                  checkpointing=plan.activation_checkpointing)
    if planner.model.is_moe:
        m = planner.model
        T = m.seq_len * plan.micro_batch
        common.update(E=m.n_experts, k=m.top_k, c=m.capacity_factor, f=m.ffn, moe_layers=len(m.moe_layers),
                      cap=M.expert_capacity(T, m.n_experts, m.top_k, m.capacity_factor),
                      M=M.moe_kept(T, m.n_experts, m.top_k, m.capacity_factor))
    per_mb = {name: fig(value, "bytes", ACTIVATION_FORMULAS.get(name.removeprefix("moe_"), name))
              for name, value in st.activations_per_microbatch.items()}
    per_mb_total = total("bytes", per_mb)
    per_mb_total.terms.update(common)
    activations = fig(st.activations, "bytes", "in_flight · activations_per_microbatch",
                      in_flight=fig(st.in_flight, "micro-batches", "1 (no pipeline); GPipe m; 1F1B min(m, p − stage); "
                                    "interleaved (p − stage) + (p−1)/v", schedule=plan.pipeline_schedule,
                                    p=plan.pp, m=plan.grad_accum, v=plan.virtual_stages, stage=st.stage),
                      activations_per_microbatch=per_mb_total)
    buffers = total("bytes", {n: fig(v, "bytes", BUFFER_FORMULAS.get(n, n)) for n, v in st.buffers.items()})
    overhead = fig(st.overhead, "bytes", "overhead_bytes + fragmentation · (activations + buffers)",
                   overhead_bytes=planner.overhead_bytes, fragmentation=planner.options.fragmentation)
    parts = {**states, "activations": activations, "buffers": buffers, "overhead": overhead}
    return {"stage": st.stage, "rank": rank_of(plan, st.stage), **parts,
            "activations_per_microbatch": per_mb_total,
            "total": total("bytes", parts), "host_bytes": st.states["host"]}


def _time(planner: Planner, numbers: PlanNumbers) -> dict[str, Figure]:
    plan, m, o = numbers.plan, planner.model, planner.options
    terms = {n: fig(v, "s", TIME_FORMULAS.get(n, n)) for n, v in numbers.time.items()}
    terms["compute"].terms.update(
        hardware_flops_per_step=numbers.hardware_flops_per_step, gpus=plan.world_size,
        F_blocks=planner.block_flops[plan.activation_checkpointing], F_head=planner.head_flops_per_token,
        peak_flops=planner.peak_flops,
        efficiency=fig(numbers.efficiency, "fraction", "compute_efficiency · w/(w + w½), w = b·s·h/t",
                       compute_efficiency=o.compute_efficiency, w_half=o.efficiency_half_work,
                       w=plan.micro_batch * m.seq_len * m.d_model / plan.tp))
    for name, key in (("tensor_parallel", "tp"), ("pipeline_p2p", "pp"), ("data_parallel", "dp"),
                      ("expert_all_to_all", "ep")):
        if name in terms:
            terms[name].terms.update(bandwidth_bytes_per_s=numbers.bandwidths[key], micro_batches=plan.grad_accum,
                                     bandwidth_rule="intra-node if group size × stride ≤ gpus_per_node, else "
                                                    "inter-node; × comm_efficiency",
                                     collectives=numbers.collectives.get(key, 0.0),
                                     latency_hops=numbers.latency_hops.get(key, 0.0),
                                     latency_s=fig(o.collective_latency_s * numbers.latency_hops.get(key, 0.0), "s",
                                                   "α · hops  (α–β ring model: all-reduce 2·(n−1) steps, all-gather/"
                                                   "reduce-scatter/all-to-all n−1, a pipeline message 1; "
                                                   "docs/formulas.md, Communication cost model)",
                                                   alpha_s=o.collective_latency_s,
                                                   hops=numbers.latency_hops.get(key, 0.0)))
    step = total("s", terms)
    tokens = plan.global_batch * m.seq_len
    gpus, peak, peak_tflops = plan.world_size, planner.peak_flops, planner.cluster.gpu.peak_tflops
    return {
        "step": step,
        "tokens_per_s": fig(tokens / step.value, "tokens/s", "B·s / step", B=plan.global_batch, s=m.seq_len),
        "mfu": fig(F.mfu(numbers.model_flops_per_step, step.value, peak_tflops, gpus), "fraction",
                   "model_flops_per_step / (step · GPUs · peak)", peak_flops=peak, gpus=gpus,
                   peak_name="dense bf16 (datasheet)"),
        "hfu": fig(F.mfu(numbers.hardware_flops_per_step, step.value, peak_tflops, gpus), "fraction",
                   "hardware_flops_per_step / (step · GPUs · peak)"),
    }


def _budget(cluster: ClusterSpec, plan: ParallelPlan, model: ModelSpec, step_s: float, tokens: float):
    per_step = plan.global_batch * model.seq_len
    steps = math.ceil(tokens / per_step)
    seconds = steps * step_s
    hours = seconds * plan.world_size / 3600
    return {"tokens": fig(tokens, "tokens", "requested"),
            "steps": fig(steps, "steps", "ceil(tokens / (B·s))", tokens_per_step=per_step),
            "time": fig(seconds, "s", "steps · step", step=step_s),
            "gpu_hours": fig(hours, "GPU·h", "time · GPUs / 3600", gpus=plan.world_size),
            "cost": fig(hours * cluster.gpu_hour_cost, "currency", "gpu_hours · gpu_hour_cost",
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
        "peak": fig(peak["total"].value, "bytes", "max over pipeline stages of the stage total",
                    stage=peak["stage"], rank=peak["rank"]),
        "peak_stage": peak["stage"], "peak_rank": peak["rank"],
        "capacity": fig(capacity, "bytes", "gpu.memory_gb · 1e9", memory_gb=cluster.gpu.memory_gb),
        "fits": peak["total"].value <= capacity,
        "rank_rule": "rank = (stage·dp + d)·tp + j; the figures are for d = 0, j = 0 (the largest shards)",
    }
    time = _time(planner, numbers)
    warnings = []
    if not memory["fits"]:
        warnings.append(f"needs {_gb(peak['total'].value)} on rank {peak['rank']} (pipeline stage {peak['stage']}) "
                        f"but the {cluster.gpu.name} has {_gb(capacity)}")
    if plan.pp > 1 and plan.grad_accum < plan.pp:
        warnings.append(f"only m={plan.grad_accum} micro-batches for pp={plan.pp} stages: the bubble dominates")
    budget = _budget(cluster, plan, model, time["step"].value, token_budget) if token_budget else {}
    return Estimate(model, plan, cluster, options, _parameters(planner, numbers), _flops(planner, numbers), memory,
                    time, budget, warnings, numbers)
