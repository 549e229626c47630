"""The planner's arithmetic for one (model, plan, cluster): plain numbers, fast enough for the auto-tuner.

``Planner`` holds what depends only on the model, cluster and options; ``Planner.evaluate(plan)`` returns a
``PlanNumbers`` with every named term and ``Planner.quick(plan)`` the totals the tuner ranks by. ``explain.estimate``
turns the same numbers into figures with formulas. Where ranks sit and what collectives cost is in ``comm``.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from trainer.planner.estimate import flops as F
from trainer.planner.estimate import memory as M
from trainer.planner.estimate.comm import (collective_counts, fits_in_node, rank_of, ring_all_reduce_s, ring_attention,
                                           ring_gather_s)
from trainer.planner.estimate.numbers import PlanNumbers, PlanSummary, StageMemory, StageStatic, StepTime
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.params import Layout, count, layout, rank_expert_params, rank_params, stage_layers
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan
from trainer.contract.schedules import V_SCHEDULES

GB = 1e9

__all__ = ["GB", "Planner", "PlanNumbers", "PlanSummary", "StageMemory", "StepTime", "rank_of", "ring_all_reduce_s",
           "ring_gather_s"]


class Planner:
    """Estimates for one model on one cluster under fixed options; ``evaluate`` is called once per plan."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, options: EstimateOptions | None = None):
        self.model, self.cluster = model, cluster
        self.options = options or EstimateOptions()
        self.counts = count(model)
        self.model_flops_per_token = F.model_flops_per_token(model)
        self.peak_flops = cluster.gpu.peak_tflops * 1e12
        self.capacity_bytes = cluster.gpu.memory_gb * GB
        self.overhead_bytes = self.options.overhead_for(cluster.gpu.name)
        self.recompute_flops = {c: F.recompute_flops_per_token(model, c) for c in ("none", "selective", "full")}
        # Hardware FLOPs per token split by where they run: the blocks (each stage its share of the layers) and
        # the V·h head (on the last stage only), so that the slowest stage sets a pipeline's pace.
        self.head_flops_per_token = 6 * model.vocab_size * model.d_model
        self.block_flops = {c: self.model_flops_per_token + r - self.head_flops_per_token
                            for c, r in self.recompute_flops.items()}
        self._dense_layer = M.LayerShape.of(model)
        self._moe_layer = M.LayerShape.of(model, moe=True) if model.is_moe else None
        self._static: dict[tuple, StageStatic] = {}
        self._layouts: dict[tuple, Layout] = {}
        self._paces: dict[tuple, tuple[int, int, list[int]]] = {}
        self._memory_ranks: dict[tuple, tuple[int, ...]] = {}
        self._settings: dict[tuple, M.ActivationSettings] = {}
        self._bandwidths: dict[tuple[int, int, int, int], Mapping[str, float]] = {}
        self._on_cpu = cluster.gpu.name == "cpu"
        # scaled_dot_product_attention has no fused CPU kernel with dropout: it falls back to the math path
        self._attention = "sdpa_math" if (self.options.attention == "fused" and self._on_cpu and model.dropout > 0) \
            else self.options.attention

    # ---- memory -------------------------------------------------------------------------------------------
    def mask_bytes(self, e: int) -> int:
        """Bytes of a dropout-mask element: the option when given, else 1 on GPUs and the activation dtype on the
        CPU."""
        if self.options.dropout_mask_bytes is not None:
            return self.options.dropout_mask_bytes
        return e if self._on_cpu else 1

    @staticmethod
    def autocast(plan: ParallelPlan) -> bool:
        """The native engine runs 16-bit plans without FSDP under autocast over fp32 weights; FSDP2 and DeepSpeed
        run the model itself in 16 bits."""
        return plan.engine == "native" and plan.precision != "fp32" and plan.zero_stage < 3

    def stat_bytes(self, plan: ParallelPlan, e: int) -> int:
        # LayerNorm statistics: fp32 on GPUs and under autocast (fp32 LayerNorm); the input's dtype on the CPU
        return e if (self._on_cpu and not self.autocast(plan)) else M.LN_STAT_BYTES

    def activation_settings(self, plan: ParallelPlan, checkpointing: str | None = None) -> M.ActivationSettings:
        """What ``plan`` and the options fix about saved activations (``checkpointing`` overrides the plan's).

        One object per distinct value: plans share them, and so do the cached terms computed from them."""
        checkpointing = checkpointing or plan.activation_checkpointing
        key = (plan.micro_batch, plan.tp, plan.sequence_parallel, checkpointing, plan.precision, plan.engine,
               plan.zero_stage)
        hit = self._settings.get(key)
        if hit is None:
            o = self.options
            e = M.activation_bytes_per_element(plan.precision)
            hit = M.ActivationSettings(
                micro_batch=plan.micro_batch, tp=plan.tp, sequence_parallel=plan.sequence_parallel,
                checkpointing=checkpointing, bytes_per_element=e, attention=self._attention,
                small_terms=o.small_terms, mask_bytes=self.mask_bytes(e), sp_gathered=o.sp_gathered,
                autocast=self.autocast(plan), stat_bytes=self.stat_bytes(plan, e), repeat_kv=o.repeat_kv,
                loss_bytes=o.loss_bytes, rmsnorm_composite=self._on_cpu)
            self._settings[key] = hit
        return hit

    def layer_shape(self, moe: bool, cp: int = 1) -> M.LayerShape:
        """A layer's shape as one rank sees it: under context parallel its s/cp positions of each sequence."""
        shape = self._moe_layer if moe else self._dense_layer
        return M.context_share(shape, cp)

    def share(self, cp: int) -> ModelSpec:
        """The model as one context-parallel rank's activations see it: sequences of s/cp positions."""
        return self.model if cp == 1 else self.model.replace(seq_len=self.model.seq_len // cp)

    # ---- pipeline stages ------------------------------------------------------------------------------------
    @staticmethod
    def _layout_key(plan: ParallelPlan) -> tuple:
        return (plan.pp, plan.model_chunks, plan.pipeline_schedule in V_SCHEDULES, plan.stage_layers,
                plan.first_stage_layers, plan.last_stage_layers)

    def layout(self, plan: ParallelPlan) -> Layout:
        """Every stage's layer count when the plan gives its own (() for equal stages) and whether its chunks sit in
        a V: what ``params.stage_layers`` places by. Cached: the tuner asks once per plan."""
        key = self._layout_key(plan)
        hit = self._layouts.get(key)
        if hit is None:
            hit = self._layouts[key] = layout(self.model, plan)
        return hit

    def rank_layers(self, plan: ParallelPlan, stage: int) -> list[int]:
        """The layer indices pipeline rank ``stage`` holds, over all its model chunks."""
        counts, v_shape = self.layout(plan)
        return stage_layers(self.model, plan.pp, plan.model_chunks, stage, counts, v_shape)

    def pace(self, plan: ParallelPlan) -> tuple[int, int, list[int]]:
        """The pipeline rank that sets the pace, the slowest by its FLOPs (its blocks and, where it holds the last
        stage, the head), as (rank, whether it holds the head, its layers). With equal stages that is the rank of
        the head; an uneven layout may make another one slower."""
        key = (self._layout_key(plan), plan.activation_checkpointing)
        hit = self._paces.get(key)
        if hit is None:
            per_layer = self.block_flops[plan.activation_checkpointing] / self.model.n_layers
            best = None
            for rank in range(plan.pp):
                layers = self.rank_layers(plan, rank)
                head = M.holds_last_stage(plan, rank)
                work = per_layer * len(layers) + (self.head_flops_per_token if head else 0.0)
                if best is None or work > best[0]:
                    best = (work, rank, head, layers)
            hit = self._paces[key] = best[1:]
        return hit

    def memory_ranks(self, plan: ParallelPlan, every: bool = False) -> tuple[int, ...]:
        """The pipeline ranks whose memory may be the peak. Equal stages: the first (most micro-batches in flight,
        the embedding) and the last (the head). An uneven layout: of the ranks holding the same layers' kinds and
        ends, the lowest, since a rank's micro-batches in flight never grow along the pipeline (``every``: all)."""
        if plan.pp == 1:
            return (0,)
        counts, _ = self.layout(plan)
        if not counts:
            return (0, plan.pp - 1)
        if every:
            return tuple(range(plan.pp))
        key = self._layout_key(plan)
        hit = self._memory_ranks.get(key)
        if hit is None:
            seen: dict[tuple, int] = {}
            m = self.model
            for rank in range(plan.pp):
                layers = self.rank_layers(plan, rank)
                kind = (len(layers), sum(1 for i in layers if m.is_moe_layer(i)), rank == 0,
                        M.holds_last_stage(plan, rank))
                seen.setdefault(kind, rank)
            hit = self._memory_ranks[key] = tuple(sorted(seen.values()))
        return hit

    def stage_memory(self, plan: ParallelPlan, stage: int) -> StageMemory:
        m, o = self.model, self.options
        pp, tp, dp = plan.pp, plan.tp, plan.dp * plan.cp  # FSDP2 shards over dp·cp
        v = plan.model_chunks
        last = M.holds_last_stage(plan, stage)
        counts, v_shape = self.layout(plan)
        params = rank_params(m, tp, pp, v, stage, plan.ep, last=last, counts=counts, v_shape=v_shape)
        experts = rank_expert_params(m, pp, v, stage, plan.ep, counts, v_shape) if plan.engine == "deepspeed" else 0
        sharded = rank_params(m, tp, pp, v, stage, plan.ep, dp, last=last, counts=counts, v_shape=v_shape) \
            if (plan.zero_stage >= 3 and plan.engine == "native") else M.deepspeed_shard(params, dp, experts, plan.ep)
        states = M.model_states(params, sharded, dp, plan.zero_stage, plan.precision, plan.engine,
                                plan.offload_optimizer, plan.offload_params, experts, plan.ep)
        if (stage == 0 and tp > 1 and plan.engine == "native" and plan.zero_stage < 3
                and (pp > 1 or not m.tied_embeddings)):
            # measured on the native trainer: the gradient of a vocabulary-split embedding that is not also the
            # head is a 1/t view of a full V×h gradient, which stays allocated
            g_bytes = M.state_bytes_per_param(plan.precision, plan.engine).gradients
            states["gradients"] += (m.vocab_size - -(-m.vocab_size // tp)) * m.d_model * g_bytes

        settings = self.activation_settings(plan)
        held = self.rank_layers(plan, stage)
        layers = len(held)
        n_moe = sum(1 for i in held if m.is_moe_layer(i))
        acts: dict[str, float] = {}
        for moe_layer, n in ((False, layers - n_moe), (True, n_moe)):
            if n:
                for name, value in M.layer_activations(self.layer_shape(moe_layer, plan.cp), settings):
                    key = ("moe_" if moe_layer else "") + name
                    acts[key] = acts.get(key, 0.0) + n * value
        for name, value in M.edge_activations(self.share(plan.cp), settings, stage == 0, last):
            acts[name] = value
        flight = M.in_flight(plan, stage)
        buffers = self._buffers(plan, settings, last, params, layers)
        dynamic = flight * sum(acts.values()) + sum(buffers.values())
        overhead = self.overhead_bytes + o.fragmentation * dynamic
        return StageMemory(stage, params, sharded, states, acts, flight, layers, buffers, overhead)

    def _buffers(self, plan: ParallelPlan, settings: M.ActivationSettings, last: bool, params: int,
                 layers: int) -> dict[str, float]:
        """Transient tensors live at the peak, beside the saved activations."""
        m, o = self.model, self.options
        e = settings.bytes_per_element
        T = m.seq_len // plan.cp * plan.micro_batch  # this rank's positions
        replicas = plan.dp * plan.cp
        g_bytes = M.state_bytes_per_param(plan.precision, plan.engine).gradients
        out: dict[str, float] = {}
        if last:
            # fp32 logits and their gradient exist together at the loss
            out["logits_and_grad"] = 2.0 * T * -(-m.vocab_size // plan.tp) * o.loss_bytes
        if plan.activation_checkpointing != "none":
            # the backward of a recomputed layer re-creates that layer's full activations
            whole = self.activation_settings(plan, "none")
            out["recompute_working_set"] = sum(v for _, v in M.layer_activations(self.layer_shape(m.is_moe, plan.cp),
                                                                                 whole))
        if plan.zero_stage >= 3 and replicas > 1:
            # two layers' gathered weights (current + prefetch) and one layer's unsharded gradient
            per_layer = params / max(layers, 1)
            out["gathered_params"] = 2 * per_layer * e + per_layer * g_bytes
        elif plan.engine == "native" and replicas > 1 and plan.tp == 1:
            # DDP (gradient_as_bucket_view off) keeps a flat copy of the gradients for the all-reduce; with tp > 1
            # the native trainer averages the DTensor gradients in place instead
            out["ddp_buckets"] = float(params * g_bytes)
        elif plan.engine == "deepspeed" and plan.dp > 1:
            out["zero_buckets"] = 2.0 * min(5e8, params) * g_bytes  # reduce + all-gather buckets of 5e8 elements
        if plan.engine == "native" and plan.precision != "fp32" and plan.zero_stage < 3:
            out["autocast_weight_copies"] = 2.0 * params  # 16-bit casts of the fp32 weights, saved for backward
        if plan.pp > 1:
            out["pipeline_p2p"] = 2.0 * T * m.d_model * e / settings.sp_split
        if m.is_moe:
            out["all_to_all"] = 2.0 * T * m.top_k * M.routed_capacity_factor(m) * m.d_model * e
        return out

    # ---- time ---------------------------------------------------------------------------------------------
    def bandwidths(self, plan: ParallelPlan) -> Mapping[str, float]:
        """Bytes/s of the tp, pp, dp and ep groups: intra-node when a group fits in a node, × comm_efficiency.
        Cached by degrees, which many plans share."""
        key = (plan.tp, plan.pp, plan.dp, plan.ep, plan.cp)
        hit = self._bandwidths.get(key)
        if hit is None:
            tp, dp, cp = plan.tp, plan.dp, plan.cp
            hit = MappingProxyType({"tp": self._bandwidth(tp, 1), "pp": self._bandwidth(plan.pp, tp * cp * dp),
                                    "dp": self._bandwidth(dp * cp, tp), "ep": self._bandwidth(plan.ep, tp),
                                    "cp": self._bandwidth(cp, tp)})
            self._bandwidths[key] = hit
        return hit

    def _bandwidth(self, size: int, stride: int) -> float:
        c = self.cluster
        inside = fits_in_node(size, stride, c.gpus_per_node)
        gbs = c.intra_node_bandwidth_gbs if inside else c.inter_node_bandwidth_gbs
        return gbs * GB * self.options.comm_efficiency

    def step_time(self, plan: ParallelPlan, params_first: int, sharded_first: int) -> StepTime:
        """Seconds of one step by named part; ``params_first`` and ``sharded_first`` are the first stage's
        parameters before and after data-parallel sharding (what its gradients and gathers move; under an uneven
        layout the largest stage's, which the others wait for)."""
        m, o = self.model, self.options
        tp, pp, b, cp = plan.tp, plan.pp, plan.micro_batch, plan.cp
        dp = plan.dp * cp  # the ranks that share the batch's tokens and average the gradients
        mb = plan.grad_accum
        ckpt = plan.activation_checkpointing
        e = M.activation_bytes_per_element(plan.precision)
        T = m.seq_len // cp * b  # positions a rank holds of its micro-batch
        tokens = plan.global_batch * m.seq_len
        hw_flops = (self.model_flops_per_token + self.recompute_flops[ckpt]) * tokens
        work = T * m.d_model / tp
        eff = o.compute_efficiency * work / (work + o.efficiency_half_work)
        # the slowest stage sets the pace: with equal stages the last (blocks/p + head); with pp = 1 this is
        # hw_flops / (dp·t)
        _, head, held = self.pace(plan)
        layers = len(held)
        slowest_stage = self.block_flops[ckpt] * layers / m.n_layers + (self.head_flops_per_token if head else 0.0)
        compute = tokens / dp * slowest_stage / tp / (self.peak_flops * eff)

        bw = self.bandwidths(plan)
        moe_here = sum(1 for i in held if m.is_moe_layer(i))
        n_moe = moe_here if plan.ep > 1 else 0
        grad_bytes = params_first * M.state_bytes_per_param(plan.precision, plan.engine).gradients
        collectives = collective_counts(plan, m.n_layers, n_moe, grad_bytes, params_first, stage_layers=layers)
        hops, calls = collectives.hops, collectives.calls
        alpha = o.collective_latency_s
        t: dict[str, float] = {"compute": compute}
        if o.layer_overhead_s or o.microbatch_overhead_s:
            # host dispatch a micro-batch pays whatever its size: per layer (forward and backward; a full
            # recompute runs the forward again, half as much again) and per micro-batch outside the layers
            passes = 1.5 if ckpt == "full" else 1.0
            t["host_overhead"] = mb * (layers * passes * o.layer_overhead_s + o.microbatch_overhead_s)
        if o.expert_overhead_s and moe_here:
            # an MoE layer runs the experts a rank holds one by one, each its own small-GEMM calls and autograd
            # nodes: a host cost per expert, per MoE layer and micro-batch (a full recompute: half again)
            passes = 1.5 if ckpt == "full" else 1.0
            t["expert_overhead"] = mb * moe_here * passes * (m.n_experts // plan.ep) * o.expert_overhead_s
        if tp > 1:
            n_ar = 6 if ckpt == "full" else 4
            t["tensor_parallel"] = (mb * layers * n_ar * ring_all_reduce_s(T * m.d_model * e, tp, bw["tp"])
                                    + alpha * hops["tp"] + o.tp_call_s * calls["tp"])
        if cp > 1:
            # the K/V ring of every layer, each hop hidden behind a block's attention where it is shorter
            ring = ring_attention(T, m.d_model, m.kv_heads * m.head_dim, tp, cp, e, bw["cp"], self.peak_flops * eff,
                                  ckpt == "full")
            t["context_parallel"] = mb * layers * ring.exposed_s + alpha * hops["cp"]
        if n_moe:
            routed = T * m.top_k * M.routed_capacity_factor(m) * m.d_model * e
            t["expert_all_to_all"] = (mb * n_moe * 4 * (plan.ep - 1) / plan.ep * routed / bw["ep"]
                                      + alpha * hops["ep"])
        per_microbatch_work = sum(t.values())
        if pp > 1:
            v = plan.model_chunks
            t["pipeline_bubble"] = per_microbatch_work * M.bubble_fraction(plan)
            r = tp if plan.sequence_parallel else 1
            t["pipeline_p2p"] = (mb * v * 2 * (T * m.d_model * e / r) / bw["pp"] + alpha * hops["pp"]
                                 + o.pp_call_s * calls["pp"])
        if dp > 1:
            if plan.zero_stage >= 3:
                # per micro-batch: all-gather weights (in e bytes) for forward and for backward; one reduce-scatter
                # of the gradients per step
                gathers = 2 * mb * ring_gather_s(params_first * e, dp, bw["dp"])
                dp_s = gathers + ring_gather_s(grad_bytes, dp, bw["dp"])
            else:
                dp_s = ring_all_reduce_s(grad_bytes, dp, bw["dp"])
            t["data_parallel"] = (dp_s + alpha * hops["dp"] + o.dp_call_s * calls["dp"]) * (1 - o.dp_overlap)
        if plan.offload_optimizer or plan.offload_params:
            pcie = o.pcie_bandwidth_gbs * GB
            moved = 2 * 2 * sharded_first if plan.offload_optimizer else 0  # 16-bit grads down, weights up
            if plan.offload_params:
                moved += 2 * mb * 2 * sharded_first
            # and the optimizer step runs on the host: Adam reads and writes ~16 bytes per parameter
            cpu_step = 16 * sharded_first / (o.host_memory_bandwidth_gbs * GB) if plan.offload_optimizer else 0.0
            t["offload"] = moved / pcie + cpu_step
        if o.step_overhead_s:
            t["step_overhead"] = o.step_overhead_s
        return StepTime(t, sum(t.values()), self.model_flops_per_token * tokens, hw_flops, eff, bw, collectives)

    # ---- the tuner's fast path -----------------------------------------------------------------------------
    def _stage_static(self, plan: ParallelPlan, stage: int, plan_key: tuple) -> StageStatic:
        """A stage's memory parts that none of the global batch, the schedule or (for dense models) the virtual
        stages change, cached: that is where the tuner's grid multiplies; ``quick`` applies the in-flight count."""
        key = (plan_key, stage)
        hit = self._static.get(key)
        if hit is None:
            st = self.stage_memory(plan, stage)
            hit = StageStatic(st.model_state_bytes, sum(st.activations_per_microbatch.values()),
                              sum(st.buffers.values()), st.params, st.params_sharded)
            self._static[key] = hit
        return hit

    def quick(self, plan: ParallelPlan) -> PlanSummary:
        """What ``evaluate`` gives, without the named parts: the peak over the first and last stages."""
        frag = self.options.fragmentation
        counts, _ = self.layout(plan)
        plan_key = (plan.tp, plan.pp, plan.dp, plan.cp, plan.micro_batch, plan.sequence_parallel, plan.ep, plan.engine,
                    plan.zero_stage, plan.activation_checkpointing, plan.precision, plan.offload_optimizer,
                    plan.offload_params, plan.virtual_stages if (self._moe_layer or counts) else 1,
                    plan.pipeline_schedule in V_SCHEDULES, counts)  # a V puts the head on the first rank
        piped = plan.pp > 1
        peak, peak_stage, first, states, flight = -1.0, 0, None, 0.0, 0.0
        for stage in self.memory_ranks(plan):
            static = self._stage_static(plan, stage, plan_key)
            if first is None or (counts and static.params > first.params):
                first = static  # what data parallel moves: the first stage's, or an uneven layout's largest
            acts = static.activation_bytes_per_microbatch
            if piped:  # without a pipeline one micro-batch is in flight
                acts *= M.in_flight(plan, stage)
            dynamic = acts + static.buffer_bytes
            total = static.state_bytes + dynamic + self.overhead_bytes + frag * dynamic
            if total > peak:
                peak, peak_stage, states, flight = total, stage, static.state_bytes, acts
        step = self.step_time(plan, first.params, first.params_sharded)
        return PlanSummary(step.seconds, peak, peak_stage, step.model_flops, states, flight)

    # ---- both ---------------------------------------------------------------------------------------------
    def evaluate(self, plan: ParallelPlan) -> PlanNumbers:
        """Every named term; the stages are the first and last pipeline ranks, or every rank under an uneven
        layout."""
        stages = [self.stage_memory(plan, stage) for stage in self.memory_ranks(plan, every=True)]
        peak = max(stages, key=lambda st: st.total)
        moved = max(stages, key=lambda st: st.params) if self.layout(plan)[0] else stages[0]
        step = self.step_time(plan, moved.params, moved.params_sharded)
        return PlanNumbers(plan=plan, stages=stages, peak_stage=peak.stage, peak_bytes=peak.total,
                           peak_rank=rank_of(plan, peak.stage), capacity_bytes=self.capacity_bytes, step_time=step)
