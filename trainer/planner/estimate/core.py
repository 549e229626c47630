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
from trainer.planner.estimate import memory_model as MM
from trainer.planner.estimate import step_model as S
from trainer.planner.estimate.comm import (collective_counts, fits_in_node, pipeline_scatter_gather, rank_of,
                                           ring_all_reduce_s, ring_attention, ring_gather_s, tp_all_reduces_per_layer)
from trainer.planner.estimate.gpu_kernels import kernels_for
from trainer.planner.estimate.kernel_time import KernelClock, LayerWork, Work, head_work, layer_work
from trainer.planner.estimate.numbers import (IN_MICROBATCH, PlanNumbers, PlanSummary, StageMemory, StageStatic,
                                               StepTime)
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
        self.capacity_bytes = MM.CAPACITY(cluster.gpu.memory_gb)
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
        self._paces: dict[tuple, tuple[int, int, list[int], int]] = {}
        self._memory_ranks: dict[tuple, tuple[int, ...]] = {}
        self._settings: dict[tuple, M.ActivationSettings] = {}
        self._bandwidths: dict[tuple[int, int, int, int], Mapping[str, float]] = {}
        self._on_cpu = cluster.gpu.name == "cpu"
        # the allocator's fragmentation of the dynamic part, expected and at the most: the CPU has no caching
        # allocator, so its high end is the expected one
        o = self.options
        high = o.fragmentation_high if o.fragmentation_high is not None else (
            o.fragmentation if self._on_cpu else M.FRAGMENTATION_HIGH)
        self.fragmentation = (o.fragmentation, high)
        # the fixed overheads of a single-rank plan and of a distributed one, named and summed
        self._fixed = {distributed: M.fixed_overheads(not self._on_cpu, distributed, o.overhead_bytes)
                       for distributed in (False, True)}
        self._fixed_sum = {d: sum(named.values(), M.Band.exact(0.0)) for d, named in self._fixed.items()}
        kernels = kernels_for(cluster.gpu.name) if self.options.compute_model == "kernels" else None
        # the kernel-by-kernel compute of a GPU whose rates are known; None: peak · efficiency
        self.clock = KernelClock(kernels, self.peak_flops, cluster.gpu.memory_bandwidth_gbs * GB) if kernels else None
        self._layer_work: dict[tuple, LayerWork] = {}
        self._head_work: dict[tuple, Work] = {}
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
                small_terms=o.small_terms, mask_bytes=self.mask_bytes(e),
                sp_gathered=o.sp_gathered and plan.engine != "megatron",  # Megatron keeps the 1/t shards
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

    def pace(self, plan: ParallelPlan) -> tuple[int, int, list[int], int]:
        """The pipeline rank that sets the pace, the slowest by its FLOPs (its blocks and, where it holds the last
        stage, the head), as (rank, whether it holds the head, its layers, how many of them have experts). With
        equal stages that is the rank of the head; an uneven layout may make another one slower."""
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
            _, rank, head, layers = best
            hit = self._paces[key] = (rank, head, layers, sum(1 for i in layers if self.model.is_moe_layer(i)))
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
        m = self.model
        pp, tp, dp = plan.pp, plan.tp, plan.dp * plan.cp  # FSDP2 shards over dp·cp
        v = plan.model_chunks
        last = M.holds_last_stage(plan, stage)
        counts, v_shape = self.layout(plan)
        params = rank_params(m, tp, pp, v, stage, plan.ep, last=last, counts=counts, v_shape=v_shape)
        experts = rank_expert_params(m, pp, v, stage, plan.ep, counts, v_shape) if plan.engine != "native" else 0
        sharded = rank_params(m, tp, pp, v, stage, plan.ep, dp, last=last, counts=counts, v_shape=v_shape) \
            if (plan.zero_stage >= 3 and plan.engine == "native") else M.deepspeed_shard(params, dp, experts, plan.ep)
        # measured on the native trainer: the gradient of a vocabulary-split embedding that is not also the head is
        # a 1/t view of a full V×h gradient, which stays allocated
        vocabulary_view = (stage == 0 and tp > 1 and plan.engine == "native" and plan.zero_stage < 3
                           and (pp > 1 or not m.tied_embeddings))
        model_states = M.model_state_terms(params, sharded, dp, plan.zero_stage, plan.precision, plan.engine,
                                           plan.offload_optimizer, plan.offload_params, experts, plan.ep,
                                           (m.vocab_size, tp, m.d_model) if vocabulary_view else None)
        states = model_states.bytes()

        settings = self.activation_settings(plan)
        held = self.rank_layers(plan, stage)
        layers = len(held)
        n_moe = sum(1 for i in held if m.is_moe_layer(i))
        activation_terms: dict[str, M.Held] = {}
        for moe_layer, n in ((False, layers - n_moe), (True, n_moe)):
            if n:
                per = "n_moe_layers" if moe_layer else ("n_dense_layers" if m.is_moe else "n_layers")
                for saved in M.layer_saved(self.layer_shape(moe_layer, plan.cp), settings):
                    activation_terms[("moe_" if moe_layer else "") + saved.name] = M.Held(saved, n, per)
        for saved in M.edge_saved(self.share(plan.cp), settings, stage == 0, last):
            activation_terms[saved.name] = M.Held(saved)
        acts = {name: h.value for name, h in activation_terms.items()}
        flight = M.in_flight(plan, stage)
        buffer_terms = self._buffers(plan, settings, last, params, layers)
        buffers = {name: float(sum(saved.value for saved in terms)) for name, terms in buffer_terms.items()}
        dynamic = MM.ACTIVATIONS(flight, sum(acts.values())) + sum(buffers.values())
        return StageMemory(stage, params, sharded, states, acts, flight, layers, buffers,
                           self.overheads(plan, dynamic), activation_terms, buffer_terms, model_states.saved)

    def overheads(self, plan: ParallelPlan, dynamic: float) -> dict[str, M.Band]:
        """What a rank's GPU holds besides the plan's tensors, named, each a range: the fixed overheads and the
        allocator's fragmentation of the ``dynamic`` bytes (activations in flight and transient buffers)."""
        named = dict(self._fixed[plan.world_size > 1])
        if dynamic and any(self.fragmentation):
            named["fragmentation"] = M.fragmentation_band(dynamic, *self.fragmentation)
        return named

    def _buffers(self, plan: ParallelPlan, settings: M.ActivationSettings, last: bool, params: int,
                 layers: int) -> dict[str, tuple[M.Saved, ...]]:
        """Transient tensors live at the peak, beside the saved activations: each the sum of its terms (one, or a
        layer's activations)."""
        m, o = self.model, self.options
        e = settings.bytes_per_element
        T = m.seq_len // plan.cp * plan.micro_batch  # this rank's positions
        replicas = plan.dp * plan.cp
        g_bytes = M.state_bytes_per_param(plan.precision, plan.engine).gradients
        out: dict[str, tuple[M.Saved, ...]] = {}

        def add(name: str, term: MM.Term, *args: float) -> None:
            out[name] = (M.Saved(name, term, args),)

        if last:
            # fp32 logits and their gradient exist together at the loss
            add("logits_and_grad", MM.LOGITS_AND_GRAD, T, m.vocab_size, plan.tp, o.loss_bytes)
        if plan.activation_checkpointing != "none":
            # the backward of a recomputed layer re-creates that layer's full activations
            whole = self.activation_settings(plan, "none")
            out["recompute_working_set"] = M.layer_saved(self.layer_shape(m.is_moe, plan.cp), whole)
        if plan.zero_stage >= 3 and replicas > 1:
            # two layers' gathered weights (current + prefetch) and one layer's unsharded gradient
            add("gathered_params", MM.GATHERED_PARAMS, params, max(layers, 1), e, g_bytes)
        elif plan.engine == "native" and replicas > 1 and plan.tp == 1:
            # DDP (gradient_as_bucket_view off) keeps a flat copy of the gradients for the all-reduce; with tp > 1
            # the native trainer averages the DTensor gradients in place instead
            add("ddp_buckets", MM.DDP_BUCKETS, params, g_bytes)
        elif plan.engine == "deepspeed" and plan.dp > 1:
            add("zero_buckets", MM.ZERO_BUCKETS, params, g_bytes)
        if plan.engine == "native" and plan.precision != "fp32" and plan.zero_stage < 3:
            add("autocast_weight_copies", MM.AUTOCAST_WEIGHT_COPIES, params)
        if plan.pp > 1:
            add("pipeline_p2p", MM.PIPELINE_P2P, T, m.d_model, e, settings.sp_split)
        if m.is_moe:
            add("all_to_all", MM.ALL_TO_ALL, T, m.top_k, M.routed_capacity_factor(m), m.d_model, e)
        return out

    # ---- time ---------------------------------------------------------------------------------------------
    def layer_work(self, plan: ParallelPlan, moe: bool) -> LayerWork:
        """One block's kernels for one micro-batch on one rank (``kernel_time``); under context parallel a rank's
        s/cp positions, whose attention reaches all s keys. Cached by what it depends on."""
        key = (plan.micro_batch, plan.tp, plan.cp, plan.sequence_parallel, plan.activation_checkpointing,
               plan.precision, moe)
        hit = self._layer_work.get(key)
        if hit is None:
            hit = self._layer_work[key] = layer_work(self.share(plan.cp), plan, self.clock,
                                                     self._attention == "fused", moe, attention_scale=plan.cp)
        return hit

    def head_work(self, plan: ParallelPlan) -> Work:
        key = (plan.micro_batch, plan.tp, plan.cp, plan.sequence_parallel, plan.precision)
        hit = self._head_work.get(key)
        if hit is None:
            hit = self._head_work[key] = head_work(self.share(plan.cp), plan, self.clock, self.options.loss_bytes)
        return hit

    def accumulation_bytes(self, plan: ParallelPlan) -> float:
        """Bytes per parameter a micro-batch's backward streams to fold its weight gradients into the step's, on
        average over the step's micro-batches: ``options.grad_accumulation_bytes`` when given, else the engine's
        own. Under autocast each 16-bit weight gradient is cast to the fp32 gradient's dtype (read e, write G);
        every micro-batch after the first adds into the gradient (read two, write one)."""
        if self.options.grad_accumulation_bytes is not None:
            return self.options.grad_accumulation_bytes
        if plan.engine == "megatron":
            return 0.0  # its gradient-accumulation fusion: the weight-gradient GEMM adds into the fp32 main gradient
        g = M.state_bytes_per_param(plan.precision, plan.engine, plan.zero_stage).gradients
        e = M.activation_bytes_per_element(plan.precision)
        cast = e + g if self.autocast(plan) else 0
        m = plan.grad_accum
        return cast + 3 * g * (m - 1) / m

    def bandwidths(self, plan: ParallelPlan) -> Mapping[str, float]:
        """Bytes/s a rank of each group moves, × comm_efficiency (``_bandwidth``); tp and dp run ring collectives,
        pp, ep and cp send point to point. Cached by degrees, which many plans share."""
        key = (plan.tp, plan.pp, plan.dp, plan.ep, plan.cp)
        hit = self._bandwidths.get(key)
        if hit is None:
            tp, dp, cp = plan.tp, plan.dp, plan.cp
            hit = MappingProxyType({"tp": self._bandwidth(tp, 1, ring=True),
                                    "pp": self._bandwidth(plan.pp, tp * cp * dp),
                                    "dp": self._bandwidth(dp * cp, tp, ring=True), "ep": self._bandwidth(plan.ep, tp),
                                    "cp": self._bandwidth(cp, tp)})
            self._bandwidths[key] = hit
        return hit

    def _bandwidth(self, size: int, stride: int, ring: bool = False) -> float:
        """The intra-node figure when the group (``size`` ranks, ``stride`` apart) fits in a node, else the
        inter-node one, which is per GPU (each GPU its own NIC, or its share of the node's). A ring collective of a
        group with k ranks on each node runs as k rings side by side (NCCL's channels), each leaving the node through
        another rank's link: k × the inter-node figure, at most the intra-node one."""
        c = self.cluster
        if fits_in_node(size, stride, c.gpus_per_node):
            gbs = c.intra_node_bandwidth_gbs
        elif ring:
            per_node = max(1, min(size, c.gpus_per_node // stride))
            gbs = min(c.intra_node_bandwidth_gbs, per_node * c.inter_node_bandwidth_gbs)
        else:
            gbs = c.inter_node_bandwidth_gbs
        return gbs * GB * self.options.comm_efficiency

    def step_time(self, plan: ParallelPlan, params_first: int, sharded_first: int) -> StepTime:
        """Seconds of one step by named part, each a term of ``step_model`` called with this plan's numbers (kept
        in ``StepTime.terms`` for the figures); ``params_first`` and ``sharded_first`` are the first stage's
        parameters before and after data-parallel sharding (what its gradients and gathers move; under an uneven
        layout the largest stage's, which the others wait for)."""
        m, o = self.model, self.options
        tp, pp, b, cp = plan.tp, plan.pp, plan.micro_batch, plan.cp
        dp = plan.dp * cp  # the ranks that share the batch's tokens and average the gradients
        mb = plan.grad_accum
        ckpt = plan.activation_checkpointing
        e = M.activation_bytes_per_element(plan.precision)
        h = m.d_model
        T = m.seq_len // cp * b  # positions a rank holds of its micro-batch
        hw_flops = F.PER_STEP(self.model_flops_per_token + self.recompute_flops[ckpt], plan.global_batch, m.seq_len)
        # the slowest stage sets the pace: with equal stages the last (blocks/p + head)
        _, head, held, moe_here = self.pace(plan)
        layers = len(held)
        passes = 1.5 if ckpt == "full" else 1.0
        used: dict[str, tuple] = {}   # each part's term and the numbers it took, and its parts'
        t: dict[str, float] = {}

        def call(name: str, term: S.Term, *args: float) -> float:
            used[name] = (term, args)
            return term.function(*args)

        def add(name: str, term: S.Term, *args: float) -> None:   # a part of the step
            used[name] = (term, args)
            t[name] = term.function(*args)

        pace = (plan.global_batch, m.seq_len, dp, self.block_flops[ckpt], layers, m.n_layers, int(head),
                self.head_flops_per_token, tp, self.peak_flops)
        if self.clock:
            kernels = (mb, layers, moe_here, self.layer_work(plan, False).seconds,
                       self.layer_work(plan, True).seconds if m.is_moe else 0.0, int(head),
                       self.head_work(plan).seconds if head else 0.0)
            add("compute", S.COMPUTE_KERNELS, *kernels)
            eff = call("efficiency", S.KERNEL_EFFICIENCY, *pace, t["compute"])
        else:
            eff = call("efficiency", S.EFFICIENCY, o.compute_efficiency, T, h, tp, o.efficiency_half_work)
            add("compute", S.COMPUTE_FLOPS, *pace, eff)

        bw = self.bandwidths(plan)
        n_moe = moe_here if plan.ep > 1 else 0
        grad_bytes = M.state_bytes_per_param(plan.precision, plan.engine).gradients
        collectives = collective_counts(plan, m.n_layers, n_moe, params_first * grad_bytes, params_first,
                                        stage_layers=layers)
        hops, calls = collectives.hops, collectives.calls
        call_options = {"tp": o.tp_call_s, "dp": o.dp_call_s, "pp": o.pp_call_s}

        def latency(group: str) -> float:
            return call(f"latency_{group}", S.LATENCY, o.collective_latency_s, hops.get(group, 0.0),
                        call_options.get(group, 0.0), calls.get(group, 0.0))

        if o.layer_overhead_s or o.microbatch_overhead_s:
            # host dispatch a micro-batch pays whatever its size: per layer (forward and backward; a full
            # recompute runs the forward again, half as much again) and per micro-batch outside the layers
            add("host_overhead", S.HOST_OVERHEAD, mb, layers, passes, o.layer_overhead_s, o.microbatch_overhead_s)
        if o.expert_overhead_s and moe_here:
            add("expert_overhead", S.EXPERT_OVERHEAD, mb, moe_here, passes, m.n_experts // plan.ep,
                o.expert_overhead_s)
        if tp > 1:
            args = (mb, layers, tp_all_reduces_per_layer(plan), tp, T, h, e, bw["tp"], latency("tp"))
            if o.tp_overlap and self.clock:
                add("tensor_parallel", S.TENSOR_PARALLEL_OVERLAP, *args,
                    self.layer_work(plan, m.is_moe).weight_grad_s)
            else:
                add("tensor_parallel", S.TENSOR_PARALLEL, *args)
        if cp > 1:
            # the K/V ring of every layer, each hop hidden behind a block's attention where it is shorter
            ring = ring_attention(T, h, m.kv_heads * m.head_dim, tp, cp, e, bw["cp"], self.peak_flops * eff,
                                  ckpt == "full")
            add("context_parallel", S.CONTEXT_PARALLEL, mb, layers, ring.exposed_s, latency("cp"))
        if n_moe:
            add("expert_all_to_all", S.EXPERT_ALL_TO_ALL, mb, n_moe, plan.ep, T, m.top_k,
                M.routed_capacity_factor(m), h, e, bw["ep"], latency("ep"))
        if self.clock:
            accumulation = self.accumulation_bytes(plan)
            if accumulation:
                add("gradient_accumulation", S.GRADIENT_ACCUMULATION, mb, params_first, accumulation,
                    self.clock.hbm)
        if pp > 1:
            v = plan.model_chunks
            parts = tuple(k for k in IN_MICROBATCH if k in t)
            work = call("microbatch_work", S.microbatch_work(parts), *(t[k] for k in parts))
            term, args = S.bubble(plan)
            bubble = call("bubble", term, *args)
            add("pipeline_bubble", S.PIPELINE_BUBBLE, work, bubble)
            if pipeline_scatter_gather(plan):
                add("pipeline_p2p", S.PIPELINE_P2P_SCATTER_GATHER, mb, v, T, h, e, tp, bw["pp"], bw["tp"],
                    latency("pp"))
            else:
                add("pipeline_p2p", S.PIPELINE_P2P, mb, v, T, h, e, tp if plan.sequence_parallel else 1, bw["pp"],
                    latency("pp"))
        if dp > 1:
            args = (o.dp_overlap, dp, params_first, grad_bytes, bw["dp"], latency("dp"))
            if plan.zero_stage >= 3:
                # per micro-batch: all-gather weights (in e bytes) for forward and for backward; one reduce-scatter
                # of the gradients per step
                add("data_parallel", S.DATA_PARALLEL_ZERO3, *args, mb, e)
            else:
                add("data_parallel", S.DATA_PARALLEL, *args)
        if plan.offload_optimizer or plan.offload_params:
            args = (sharded_first, o.pcie_bandwidth_gbs * GB)
            if plan.offload_optimizer:
                args += (o.host_memory_bandwidth_gbs * GB,)
            if plan.offload_params:
                args += (mb,)
            add("offload", S.offload_term(plan.offload_optimizer, plan.offload_params), *args)
        if self.clock and not plan.offload_optimizer:   # offloaded, the host's step is part of "offload"
            add("optimizer", S.OPTIMIZER, sharded_first,
                M.optimizer_bytes_per_param(plan.precision, plan.engine, plan.zero_stage), self.clock.hbm)
        if o.step_overhead_s:
            add("step_overhead", S.STEP_OVERHEAD, o.step_overhead_s)
        return StepTime(t, sum(t.values()), F.PER_STEP(self.model_flops_per_token, plan.global_batch, m.seq_len),
                        hw_flops, eff, bw, collectives, used)

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
        counts, _ = self.layout(plan)
        plan_key = (plan.tp, plan.pp, plan.dp, plan.cp, plan.micro_batch, plan.sequence_parallel, plan.ep, plan.engine,
                    plan.zero_stage, plan.activation_checkpointing, plan.precision, plan.offload_optimizer,
                    plan.offload_params, plan.virtual_stages if (self._moe_layer or counts) else 1,
                    plan.pipeline_schedule in V_SCHEDULES, counts)  # a V puts the head on the first rank
        piped = plan.pp > 1
        peak, peak_stage, first, states, flight, high = -1.0, 0, None, 0.0, 0.0, 0.0
        fixed = self._fixed_sum[plan.world_size > 1]
        frag, frag_high = self.fragmentation
        for stage in self.memory_ranks(plan):
            static = self._stage_static(plan, stage, plan_key)
            if first is None or (counts and static.params > first.params):
                first = static  # what data parallel moves: the first stage's, or an uneven layout's largest
            acts = static.activation_bytes_per_microbatch
            if piped:  # without a pipeline one micro-batch is in flight
                acts = MM.ACTIVATIONS(M.in_flight(plan, stage), acts)
            dynamic = acts + static.buffer_bytes
            total = static.state_bytes + dynamic + fixed.expected + MM.FRAGMENTATION(frag, dynamic)
            if total > peak:
                peak, peak_stage, states, flight = total, stage, static.state_bytes, acts
            high = max(high, static.state_bytes + dynamic + fixed.high + MM.FRAGMENTATION(frag_high, dynamic))
        step = self.step_time(plan, first.params, first.params_sharded)
        return PlanSummary(step.seconds, peak, peak_stage, step.model_flops, states, flight, high)

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
