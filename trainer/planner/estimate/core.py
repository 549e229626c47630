"""The planner's arithmetic for one (model, plan, cluster): plain numbers, fast enough for the auto-tuner.

``Planner`` holds what depends only on the model, cluster and options; ``Planner.evaluate(plan)`` returns a
``PlanNumbers`` with every named term. ``report.estimate`` turns the same numbers into figures with formulas.

Rank layout (the native trainer's mesh, trainer/parallel/mesh.py): a (pp, dp, tp) grid with tp innermost, so
rank = (stage·dp + d)·tp + j. A group of n ranks with stride k sits inside one node when n·k ≤ gpus_per_node
(tp: stride 1; dp and ep: t; pp: t·d) and then uses the intra-node bandwidth, else the inter-node one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer.planner.estimate import flops as F
from trainer.planner.estimate import memory as M
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.params import count, rank_expert_params, rank_params
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan

GB = 1e9


@dataclass
class StageMemory:
    stage: int
    params: int                    # parameters stored on the rank before data-parallel sharding
    params_sharded: int            # after ZeRO-3 / FSDP sharding
    states: dict[str, float]       # weights, gradients, optimizer, host
    activations_per_microbatch: dict[str, float]
    in_flight: float
    layers: int
    buffers: dict[str, float]
    overhead: float

    @property
    def activations(self) -> float:
        return self.in_flight * sum(self.activations_per_microbatch.values())

    @property
    def model_state_bytes(self) -> float:
        s = self.states
        return s["weights"] + s["gradients"] + s["optimizer"]

    @property
    def total(self) -> float:
        return self.model_state_bytes + self.activations + sum(self.buffers.values()) + self.overhead


@dataclass
class PlanNumbers:
    plan: ParallelPlan
    stages: list[StageMemory]
    peak_stage: int
    peak_bytes: float
    peak_rank: int
    time: dict[str, float] = field(default_factory=dict)   # named seconds per step
    step_s: float = 0.0
    model_flops_per_step: float = 0.0
    hardware_flops_per_step: float = 0.0
    efficiency: float = 0.0
    bandwidths: dict[str, float] = field(default_factory=dict)
    collectives: dict[str, float] = field(default_factory=dict)   # collectives (messages) per step, by group
    latency_hops: dict[str, float] = field(default_factory=dict)  # ring steps those take: α multiplies these

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    capacity_bytes: float = 0.0


def rank_of(plan: ParallelPlan, stage: int, d: int = 0, j: int = 0) -> int:
    """Global rank of pipeline stage ``stage``, data-parallel index d, tensor-parallel index j."""
    return (stage * plan.dp + d) * plan.tp + j


def _fits_in_node(size: int, stride: int, gpus_per_node: int) -> bool:
    return size * stride <= gpus_per_node


def ring_all_reduce_s(nbytes: float, n: int, bandwidth: float) -> float:
    """2·(n−1)/n · S/β (docs/formulas.md, Communication cost model)."""
    return 2 * (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


def ring_gather_s(nbytes: float, n: int, bandwidth: float) -> float:
    """All-gather or reduce-scatter of S bytes in total: (n−1)/n · S/β."""
    return (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


# DDP's default bucket_cap_mb: gradients are all-reduced in ~25 MB buckets, one collective each
DDP_BUCKET_BYTES = 25 * 1024 * 1024
# DeepSpeed's default reduce_bucket_size, in elements
ZERO_BUCKET_ELEMENTS = 5e8


def collective_counts(plan: ParallelPlan, n_layers: int, moe_layers_per_stage: int, grad_bytes: float,
                      params_first: int) -> tuple[dict[str, float], dict[str, float]]:
    """(collectives, latency hops) one rank issues per step, by group (tp, ep, pp, dp).

    Bandwidth alone prices a collective by its bytes; small ones (tiny models, gloo, many FSDP units) are paid per
    call. α–β ring model (docs/formulas.md, Communication cost model, with its per-step latency): an all-reduce over n
    ranks is 2·(n−1) steps, 2·(n−1)·α + 2·(n−1)/n·S/β; an all-gather or reduce-scatter (n−1)·α + (n−1)/n·S/β; an
    all-to-all (n−1)·α + …; a point-to-point message α + S/β. Hops = Σ collectives × their steps; step time adds
    α · hops. Counts follow what the trainer issues (trainer/parallel/*.py, trainer/train.py):
      tp  m · [layers · n + edges] all-reduces, n = 4 a layer (2 forward, 2 backward; docs/formulas.md) or 6 with
          full recompute (the forward runs twice); edges: the vocabulary-parallel embedding forward and the head
          input backward (2; with a pipeline the first stage holds one and the last the other: 1); sequence parallel replaces each by an all-gather and a reduce-scatter (twice the calls,
          the same hops)
      ep  m · moe_layers · 4 all-to-alls (dispatch and combine, forward and backward)
      pp  m · v · 2 messages (an activation forward and its gradient back, per micro-batch per chunk)
      dp  ZeRO-3 (FSDP2: one unit per block + a root per chunk, v with interleaving): m · (units + layers) all-gathers (forward, and the
          backward re-gather of each block; not with a pipeline, which keeps blocks gathered, nor for the root,
          which FSDP2 does not reshard) + units reduce-scatters (once a step: gradient sync on the last
          micro-batch); DDP: ⌈grad bytes / 25 MiB⌉ bucket all-reduces; tp > 1 or pp > 1 (the trainer's flat
          gradient sync after backward): 1 all-reduce; DeepSpeed ZeRO 0–2: ⌈P_rank / 5e8⌉ buckets.
    """
    m = plan.grad_accum
    calls: dict[str, float] = {}
    hops: dict[str, float] = {}
    layers = n_layers // plan.pp
    v = plan.virtual_stages if plan.pipeline_schedule == "interleaved" else 1
    if plan.tp > 1:
        per = 6 if plan.activation_checkpointing == "full" else 4
        all_reduces = m * (layers * per + (2 if plan.pp == 1 else 1))
        calls["tp"] = float(all_reduces * (2 if plan.sequence_parallel else 1))
        hops["tp"] = float(all_reduces * 2 * (plan.tp - 1))
    if plan.ep > 1 and moe_layers_per_stage:
        calls["ep"] = float(m * moe_layers_per_stage * 4)
        hops["ep"] = calls["ep"] * (plan.ep - 1)
    if plan.pp > 1:
        calls["pp"] = hops["pp"] = float(m * v * 2)
    if plan.dp > 1:
        if plan.zero_stage >= 3:
            units = layers + v
            regather = layers if plan.pp == 1 else 0
            calls["dp"] = float(m * (units + regather) + units)
            hops["dp"] = calls["dp"] * (plan.dp - 1)
        else:
            if plan.engine == "deepspeed":
                calls["dp"] = float(-(-params_first // ZERO_BUCKET_ELEMENTS))
            elif plan.tp > 1 or plan.pp > 1:
                calls["dp"] = 1.0
            else:
                calls["dp"] = float(-(-grad_bytes // DDP_BUCKET_BYTES))
            hops["dp"] = calls["dp"] * 2 * (plan.dp - 1)
    return calls, hops


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
        self.kv_dim = model.kv_heads * model.head_dim
        self._moe = (model.n_experts, model.top_k, model.capacity_factor) if model.is_moe else None
        self._recompute = {c: F.recompute_flops_per_token(model, c) for c in ("none", "selective", "full")}
        # Hardware FLOPs per token split by where they run: the blocks (spread evenly over the pipeline stages)
        # and the V·h head (on the last stage only), so that the slowest stage sets a pipeline's pace.
        self.head_flops_per_token = 6 * model.vocab_size * model.d_model
        self._block_flops = {c: self.model_flops_per_token + r - self.head_flops_per_token
                             for c, r in self._recompute.items()}
        self._static: dict[tuple, tuple] = {}
        # MoE layers among the first k layers (pp = 1 for MoE, so a stage holds the first n_layers // pp)
        self._moe_layers = {k: sum(1 for i in range(k) if model.is_moe_layer(i)) for k in range(model.n_layers + 1)} \
            if model.is_moe else {}
        on_cpu = cluster.gpu.name == "cpu"
        self._mask_bytes = self.options.dropout_mask_bytes  # None: 1 byte on GPUs, the activation dtype on the CPU
        # scaled_dot_product_attention has no fused CPU kernel with dropout: it falls back to the math path
        self._attention = "sdpa_math" if (self.options.attention == "fused" and on_cpu and model.dropout > 0) \
            else self.options.attention
        self._on_cpu = on_cpu

    # ---- memory -------------------------------------------------------------------------------------------
    def mask_bytes(self, e: int) -> int:
        if self._mask_bytes is not None:
            return self._mask_bytes
        return e if self._on_cpu else 1

    @staticmethod
    def autocast(plan: ParallelPlan) -> bool:
        """The native engine runs 16-bit plans without FSDP under autocast over fp32 weights; FSDP2 and DeepSpeed
        run the model itself in 16 bits."""
        return plan.engine == "native" and plan.precision != "fp32" and plan.zero_stage < 3

    def stat_bytes(self, plan: ParallelPlan, e: int) -> int:
        # LayerNorm statistics: fp32 on GPUs and under autocast (fp32 LayerNorm); the input's dtype on the CPU
        return e if (self._on_cpu and not self.autocast(plan)) else M.LN_STAT_BYTES

    def _layer_terms(self, plan: ParallelPlan, e: int, moe: bool, checkpointing: str | None = None):
        m, o = self.model, self.options
        return M.layer_activations(m.d_model, m.ffn, self.kv_dim, m.n_heads, m.seq_len, plan.micro_batch, plan.tp,
                                   plan.sequence_parallel, checkpointing or plan.activation_checkpointing, e,
                                   self._attention, m.dropout > 0, o.small_terms, self._moe if moe else None,
                                   m.positions == "rope", m.head_dim, self.mask_bytes(e), o.sp_gathered,
                                   self.autocast(plan), self.stat_bytes(plan, e), o.repeat_kv)

    def stage_memory(self, plan: ParallelPlan, stage: int) -> StageMemory:
        m, o = self.model, self.options
        pp, tp, dp = plan.pp, plan.tp, plan.dp
        e = M.activation_bytes_per_element(plan.precision)
        v = plan.virtual_stages if plan.pipeline_schedule == "interleaved" else 1
        params = rank_params(m, tp, pp, v, stage, plan.ep)
        experts = rank_expert_params(m, pp, v, stage, plan.ep) if plan.engine == "deepspeed" else 0
        sharded = rank_params(m, tp, pp, v, stage, plan.ep, dp) if (plan.zero_stage >= 3 and plan.engine == "native") \
            else M.deepspeed_shard(params, dp, experts, plan.ep)
        states = M.model_states(params, sharded, dp, plan.zero_stage, plan.precision, plan.engine,
                                plan.offload_optimizer, plan.offload_params, experts, plan.ep)
        if (stage == 0 and tp > 1 and plan.engine == "native" and plan.zero_stage < 3
                and (pp > 1 or not m.tied_embeddings)):
            # measured on the native trainer: the gradient of a vocabulary-split embedding that is not also the
            # head is a 1/t view of a full V×h gradient, which stays allocated
            _, g_bytes, _ = M.state_bytes_per_param(plan.precision, plan.engine)
            states["gradients"] += (m.vocab_size - -(-m.vocab_size // tp)) * m.d_model * g_bytes

        layers = m.n_layers // pp
        n_moe = sum(1 for i in range(layers) if m.is_moe_layer(i)) if m.is_moe else 0  # pp = 1 for MoE
        acts: dict[str, float] = {}
        for moe_layer, n in ((False, layers - n_moe), (True, n_moe)):
            if n:
                for name, value in self._layer_terms(plan, e, moe_layer):
                    key = ("moe_" if moe_layer else "") + name
                    acts[key] = acts.get(key, 0.0) + n * value
        for name, value in M.edge_activations(m, stage == 0, stage == pp - 1, plan.micro_batch, tp,
                                              plan.sequence_parallel, e, o.loss_bytes, o.small_terms,
                                              self.mask_bytes(e), o.sp_gathered, self.autocast(plan),
                                              self.stat_bytes(plan, e)):
            acts[name] = value
        flight = M.in_flight(plan.pipeline_schedule, pp, plan.grad_accum, v, stage)
        buffers = self._buffers(plan, stage, params, sharded, e, layers)
        dynamic = flight * sum(acts.values()) + sum(buffers.values())
        overhead = self.overhead_bytes + o.fragmentation * dynamic
        return StageMemory(stage, params, sharded, states, acts, flight, layers, buffers, overhead)

    def _buffers(self, plan: ParallelPlan, stage: int, params: int, sharded: int, e: int, layers: int) -> dict:
        """Transient tensors live at the peak, beside the saved activations."""
        m, o = self.model, self.options
        T = m.seq_len * plan.micro_batch
        r = plan.tp if plan.sequence_parallel else 1
        _, g_bytes, _ = M.state_bytes_per_param(plan.precision, plan.engine)
        out: dict[str, float] = {}
        if stage == plan.pp - 1:
            # fp32 logits and their gradient exist together at the loss
            out["logits_and_grad"] = 2.0 * T * -(-m.vocab_size // plan.tp) * o.loss_bytes
        if plan.activation_checkpointing != "none":
            # the backward of a recomputed layer re-creates that layer's full activations
            out["recompute_working_set"] = sum(v for _, v in self._layer_terms(plan, e, bool(self._moe), "none"))
        if plan.zero_stage >= 3 and plan.dp > 1:
            # two layers' gathered weights (current + prefetch) and one layer's unsharded gradient
            per_layer = params / max(layers, 1)
            out["gathered_params"] = 2 * per_layer * e + per_layer * g_bytes
        elif plan.engine == "native" and plan.dp > 1 and plan.tp == 1:
            # DDP (gradient_as_bucket_view off) keeps a flat copy of the gradients for the all-reduce; with tp > 1
            # the native trainer averages the DTensor gradients in place instead
            out["ddp_buckets"] = float(params * g_bytes)
        elif plan.engine == "deepspeed" and plan.dp > 1:
            out["zero_buckets"] = 2.0 * min(5e8, params) * g_bytes  # reduce + all-gather buckets of 5e8 elements
        if plan.engine == "native" and plan.precision != "fp32" and plan.zero_stage < 3:
            out["autocast_weight_copies"] = 2.0 * params  # 16-bit casts of the fp32 weights, saved for backward
        if plan.pp > 1:
            out["pipeline_p2p"] = 2.0 * T * m.d_model * e / r
        if self._moe:
            out["all_to_all"] = 2.0 * T * m.top_k * m.capacity_factor * m.d_model * e
        return out

    # ---- time ---------------------------------------------------------------------------------------------
    def _bandwidth(self, size: int, stride: int) -> float:
        c = self.cluster
        gbs = c.intra_node_bandwidth_gbs if _fits_in_node(size, stride, c.gpus_per_node) else c.inter_node_bandwidth_gbs
        return gbs * GB * self.options.comm_efficiency

    def step_time(self, plan: ParallelPlan, params_first: int, sharded_first: int) -> tuple[dict, float, float, dict]:
        m, o = self.model, self.options
        tp, pp, dp, b = plan.tp, plan.pp, plan.dp, plan.micro_batch
        mb = plan.grad_accum
        e = M.activation_bytes_per_element(plan.precision)
        T = m.seq_len * b
        tokens = plan.global_batch * m.seq_len
        hw_flops = (self.model_flops_per_token + self._recompute[plan.activation_checkpointing]) * tokens
        work = b * m.seq_len * m.d_model / tp
        eff = o.compute_efficiency * work / (work + o.efficiency_half_work)
        # the last stage (blocks/p + head) is the slowest; with pp = 1 this is hw_flops / (dp·t)
        slowest_stage = self._block_flops[plan.activation_checkpointing] / pp + self.head_flops_per_token
        compute = tokens / dp * slowest_stage / tp / (self.peak_flops * eff)

        bw = {"tp": self._bandwidth(tp, 1), "pp": self._bandwidth(pp, tp * dp), "dp": self._bandwidth(dp, tp),
              "ep": self._bandwidth(plan.ep, tp)}
        layers = m.n_layers // pp
        n_moe = self._moe_layers.get(layers, 0) if self._moe and plan.ep > 1 else 0
        _, g_bytes, _ = M.state_bytes_per_param(plan.precision, plan.engine)
        grad_bytes = params_first * g_bytes
        calls, hops = collective_counts(plan, m.n_layers, n_moe, grad_bytes, params_first)
        alpha = o.collective_latency_s
        t: dict[str, float] = {"compute": compute}
        if tp > 1:
            n_ar = 6 if plan.activation_checkpointing == "full" else 4
            t["tensor_parallel"] = (mb * layers * n_ar * ring_all_reduce_s(T * m.d_model * e, tp, bw["tp"])
                                    + alpha * hops["tp"])
        if n_moe:
            routed = T * m.top_k * m.capacity_factor * m.d_model * e
            t["expert_all_to_all"] = (mb * n_moe * 4 * (plan.ep - 1) / plan.ep * routed / bw["ep"]
                                      + alpha * hops["ep"])
        per_microbatch_work = sum(t.values())
        if pp > 1:
            v = plan.virtual_stages if plan.pipeline_schedule == "interleaved" else 1
            t["pipeline_bubble"] = per_microbatch_work * (pp - 1) / (v * mb)
            r = tp if plan.sequence_parallel else 1
            t["pipeline_p2p"] = mb * v * 2 * (T * m.d_model * e / r) / bw["pp"] + alpha * hops["pp"]
        if dp > 1:
            if plan.zero_stage >= 3:
                # per micro-batch: all-gather weights for forward and for backward; one reduce-scatter per step
                w_comm = M.activation_bytes_per_element(plan.precision)
                gathers = 2 * mb * ring_gather_s(params_first * w_comm, dp, bw["dp"])
                dp_s = gathers + ring_gather_s(grad_bytes, dp, bw["dp"])
            else:
                dp_s = ring_all_reduce_s(grad_bytes, dp, bw["dp"])
            t["data_parallel"] = (dp_s + alpha * hops["dp"]) * (1 - o.dp_overlap)
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
        model_flops = self.model_flops_per_token * tokens
        return t, model_flops, hw_flops, {"efficiency": eff, **bw, "collectives": calls,
                                                    "latency_hops": hops}

    # ---- the tuner's fast path -----------------------------------------------------------------------------
    def _stage_static(self, plan: ParallelPlan, stage: int) -> tuple:
        """(model states, activations per micro-batch, buffers, params, sharded params) of a stage, cached.

        None of these depend on the global batch, the schedule or (for dense models) the virtual stages, which is
        where the tuner's grid multiplies; the in-flight count is applied by ``quick``.
        """
        key = (plan.tp, plan.pp, plan.dp, plan.micro_batch, plan.sequence_parallel, plan.ep, plan.engine,
               plan.zero_stage, plan.activation_checkpointing, plan.precision, plan.offload_optimizer,
               plan.offload_params, stage, plan.virtual_stages if self._moe else 1)
        hit = self._static.get(key)
        if hit is None:
            st = self.stage_memory(plan, stage)
            hit = (st.model_state_bytes, sum(st.activations_per_microbatch.values()), sum(st.buffers.values()),
                   st.params, st.params_sharded)
            self._static[key] = hit
        return hit

    def quick(self, plan: ParallelPlan) -> tuple[float, float, int, float, float, float]:
        """(step seconds, peak bytes per GPU, peak stage, model FLOPs per step, the peak stage's model states and
        activations in flight) — what ``evaluate`` gives, without the named parts."""
        v = plan.virtual_stages if plan.pipeline_schedule == "interleaved" else 1
        frag = self.options.fragmentation
        peak, peak_stage, first, parts = -1.0, 0, None, (0.0, 0.0)
        for stage in ((0, plan.pp - 1) if plan.pp > 1 else (0,)):
            states, acts, buffers, params, sharded = self._stage_static(plan, stage)
            if first is None:
                first = (params, sharded)
            flight = M.in_flight(plan.pipeline_schedule, plan.pp, plan.grad_accum, v, stage) * acts
            dynamic = flight + buffers
            total = states + dynamic + self.overhead_bytes + frag * dynamic
            if total > peak:
                peak, peak_stage, parts = total, stage, (states, flight)
        t, model_flops, _, _ = self.step_time(plan, *first)
        return sum(t.values()), peak, peak_stage, model_flops, parts[0], parts[1]

    # ---- both ---------------------------------------------------------------------------------------------
    def evaluate(self, plan: ParallelPlan) -> PlanNumbers:
        stages = [self.stage_memory(plan, 0)]
        if plan.pp > 1:
            stages.append(self.stage_memory(plan, plan.pp - 1))
        peak = max(stages, key=lambda st: st.total)
        t, model_flops, hw_flops, bw = self.step_time(plan, stages[0].params, stages[0].params_sharded)
        return PlanNumbers(plan=plan, stages=stages, peak_stage=peak.stage, peak_bytes=peak.total,
                           peak_rank=rank_of(plan, peak.stage), time=t, step_s=sum(t.values()),
                           model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops,
                           efficiency=bw.pop("efficiency"), collectives=bw.pop("collectives"),
                           latency_hops=bw.pop("latency_hops"), bandwidths=bw,
                           capacity_bytes=self.capacity_bytes)
