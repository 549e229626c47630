"""``estimate(model, plan, cluster)``: the planner's numbers as figures that carry their formulas.

The values come from ``core.Planner`` (the same arithmetic the auto-tuner ranks with); this module names each term,
shows the formula it came from and the inputs, and returns a JSON-serialisable ``Estimate``. Step time and memory
print the formulas of the terms that computed them (``step_model``, ``memory_model``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.planner.estimate import flops as F
from trainer.planner.estimate import memory as M
from trainer.planner.estimate import memory_model as MM
from trainer.planner.estimate import params as P
from trainer.planner.estimate import params_model as PM
from trainer.planner.estimate import step_model as S
from trainer.planner.estimate.comm import BANDWIDTH_RULE, RANK_RULE
from trainer.planner.estimate.core import GB, Planner, PlanNumbers, StageMemory, rank_of
from trainer.planner.estimate.expr import Term
from trainer.planner.estimate.figure import Figure, symbolic, total
from trainer.planner.estimate.kernel_time import Work
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError, check_plan


def _figure(term: Term, args: tuple, unit: str, **shown: Any) -> Figure:
    """A figure of a term called with ``args`` (numbers, or figures standing for their values): its value, its
    formula and those numbers; ``shown`` adds what the reader may want beside them."""
    numbers = tuple(a.value if isinstance(a, Figure) else a for a in args)
    return Figure(term.function(*numbers), unit, term.formula, {**term.values(args), **shown})


def _saved_figure(saved: M.Saved, unit: str = "bytes", count: int = 1, per: str = "", **shown: Any) -> Figure:
    """A figure of a ``memory_model`` term: its value, its formula and the numbers it took; ``per`` names a count of
    it (a stage's layers of one kind), ``shown`` adds what the reader may want beside them."""
    if per:
        return Figure(count * saved.value, unit, saved.term.formula_times(per),
                      {**saved.term.values(saved.args), per: count, **shown})
    return _figure(saved.term, saved.args, unit, **shown)


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
    m, plan = planner.model, numbers.plan
    out = {name: _figure(term, args, "parameters") for name, (term, args) in P.count_terms(m).items()
           if name != "active" or m.is_moe}
    counts, v_shape = planner.layout(plan)
    for st in numbers.stages:
        parts = P.rank_param_parts(m, plan.tp, plan.pp, plan.model_chunks, st.stage, plan.ep,
                                   last=M.holds_last_stage(plan, st.stage), counts=counts, v_shape=v_shape)
        args = tuple(parts[name] for name in PM.RANK.params.split())
        out[f"stage_{st.stage}_rank"] = _figure(PM.RANK, args, "parameters", stage=st.stage, tp=plan.tp, pp=plan.pp,
                                                ep=plan.ep)
    return out


def _flops(planner: Planner, numbers: PlanNumbers) -> dict[str, Figure]:
    m, plan = planner.model, numbers.plan
    B, L, h, s, V = plan.global_batch, m.n_layers, m.d_model, m.seq_len, m.vocab_size
    N = planner.counts.matmul_per_token
    per_token = _figure(F.MODEL_FLOPS_PER_TOKEN, (N, L, h, s), "FLOP/token")
    ckpt = plan.activation_checkpointing
    recompute = _figure(F.RECOMPUTE_FLOPS_PER_TOKEN[ckpt], F.recompute_args(m, ckpt), "FLOP/token",
                        checkpointing=ckpt)
    hw = total("FLOP/token", {"model": per_token, "recompute": recompute})
    out = {"model_per_token": per_token, "hardware_per_token": hw,
           "model_per_step": _figure(F.PER_STEP, (per_token, B, s), "FLOP"),
           "hardware_per_step": _figure(F.PER_STEP, (hw, B, s), "FLOP")}
    if not m.is_moe and m.ffn == 4 * m.d_model and m.kv_heads == m.n_heads:
        full = ckpt == "full"
        out["narayanan_check"] = _figure(F.NARAYANAN[full], (B, s, L, h, V), "FLOP")
    return out


def _stage_figures(planner: Planner, plan: ParallelPlan, st: StageMemory) -> dict[str, Any]:
    m = planner.model
    shown = dict(P_rank=st.params, P_shard=st.params_sharded, zero_stage=plan.zero_stage, dp=plan.dp * plan.cp)
    states = {name: _saved_figure(saved, **shown) for name, saved in st.state_terms.items()}
    common = dict(s=m.seq_len // plan.cp, b=plan.micro_batch, h=m.d_model, a=m.n_heads, t=plan.tp,
                  e=M.activation_bytes_per_element(plan.precision), layers=st.layers,
                  sequence_parallel=plan.sequence_parallel, checkpointing=plan.activation_checkpointing)
    if m.is_moe:
        common.update(E=m.n_experts, k=m.top_k, c=M.routed_capacity_factor(m), f=m.ffn, moe_layers=len(m.moe_layers))
    held = planner.rank_layers(plan, st.stage)
    per_mb = {name: _saved_figure(h.saved, count=h.count, per=h.per) for name, h in st.activation_terms.items()}
    per_mb_total = total("bytes", per_mb)
    per_mb_total.terms.update(common)
    in_flight = _saved_figure(M.in_flight_saved(plan, st.stage), "micro-batches", schedule=plan.pipeline_schedule)
    activations = _figure(MM.ACTIVATIONS, (in_flight, per_mb_total), "bytes")
    buffers = {}
    for name, terms in st.buffer_terms.items():
        if name == "recompute_working_set":
            layer = {saved.name: _saved_figure(saved) for saved in terms}
            buffers[name] = total("bytes", layer, note="one layer's activations without recompute, re-created by "
                                  "the backward of a recomputed layer")
        else:
            (saved,) = terms
            buffers[name] = _saved_figure(saved)
    buffers = total("bytes", buffers)
    overhead = total("bytes", {name: _overhead_figure(name, band, planner, activations.value + buffers.value)
                               for name, band in st.overheads.items()})
    parts = {**states, "activations": activations, "buffers": buffers, "overhead": overhead}
    return {"stage": st.stage, "rank": rank_of(plan, st.stage), "layers": _runs(held), **parts,
            "activations_per_microbatch": per_mb_total,
            "total": total("bytes", parts), "host_bytes": st.states["host"],
            "band": st.band.to_dict()}


def _overhead_figure(name: str, band: M.Band, planner: Planner, dynamic: float) -> Figure:
    """One named overhead as expected, with its range."""
    if name == "fragmentation":
        expected, high = planner.fragmentation
        return _figure(MM.FRAGMENTATION, (expected, dynamic), "bytes", fragmentation_high=high, high=band.high)
    return _figure(MM.FIXED_OVERHEAD, (band.expected,), "bytes", low=band.low, high=band.high)


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
    a = _figure(S.HALF_BLOCK, (T, m.d_model, plan.tp, flops), "s", peak_flops=planner.peak_flops,
                efficiency=numbers.efficiency)
    blocks = (_figure(S.KV_BLOCK, (T, kv, plan.tp, e), "bytes"), _figure(S.GRAD_BLOCK, (T, kv, plan.tp), "bytes"))
    forwards = 2 if plan.activation_checkpointing == "full" else 1
    return _figure(S.RING_EXPOSED, (forwards, plan.cp, *blocks, bw, a), "s")


def _work(work: Work, what: str) -> Figure:
    return _figure(S.PASS_KERNELS, (work.gemm, work.attention, work.elementwise), "s", kernels_of=what)


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
        shown["microbatch_work_s"] = _term_figure(used, "microbatch_work", "s")
    terms = {}
    for name, value in time.items():
        own = dict(shown)
        extra: dict[str, Any] = {}
        group = GROUPS.get(name)
        if group:
            own["latency_s"] = _term_figure(used, f"latency_{group}", "s")
            extra = dict(micro_batches=plan.grad_accum, collectives=numbers.collectives.get(group, 0.0),
                         latency_hops=numbers.latency_hops.get(group, 0.0),
                         bandwidth_rule=BANDWIDTH_RULE)
        if name == "compute":
            pace_rank = planner.pace(plan)[0]
            extra = dict(hardware_flops_per_step=numbers.hardware_flops_per_step, gpus=plan.world_size,
                         pace_rank=pace_rank)
        terms[name] = _term_figure(used, name, "s", own)
        terms[name].terms.update(extra)
    step = total("s", terms)
    gpus, peak = plan.world_size, planner.peak_flops
    return {
        "step": step,
        "tokens_per_s": _figure(S.TOKENS_PER_S, (plan.global_batch, m.seq_len, step.value), "tokens/s"),
        "mfu": _figure(F.UTILISATION, (numbers.model_flops_per_step, step.value, peak, gpus), "fraction",
                       peak_name="dense bf16 (datasheet)", what="model FLOPs"),
        "hfu": _figure(F.UTILISATION, (numbers.hardware_flops_per_step, step.value, peak, gpus), "fraction",
                       what="hardware FLOPs"),
    }


def run_time(steps: int | Figure, step: float | Figure | dict) -> Figure:
    """The training time of ``steps`` steps of ``step`` seconds (a figure, or one as ``Figure.to_dict`` wrote it)."""
    step_s = step["value"] if isinstance(step, dict) else step
    return _figure(S.RUN_TIME, (steps, step_s), "s", step=step)


def _budget(cluster: ClusterSpec, plan: ParallelPlan, model: ModelSpec, step_s: float, tokens: float):
    tokens_figure = _figure(S.BUDGET_TOKENS, (tokens,), "tokens")
    steps = _figure(S.BUDGET_STEPS, (tokens, plan.global_batch, model.seq_len), "steps")
    seconds = run_time(steps, step_s)
    hours = _figure(S.BUDGET_GPU_HOURS, (seconds, plan.world_size), "GPU·h")
    return {"tokens": tokens_figure, "steps": steps, "time": seconds, "gpu_hours": hours,
            # the hours as a number: a page names a rank's hours itself (a CPU cluster's are process-hours)
            "cost": _figure(S.BUDGET_COST, (hours.value, cluster.gpu_hour_cost), "currency")}


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
        "peak": _figure(MM.peak(tuple(st["stage"] for st in stages)), tuple(st["total"].value for st in stages),
                        "bytes", stage=peak["stage"], rank=peak["rank"]),
        "peak_stage": peak["stage"], "peak_rank": peak["rank"],
        "capacity": _figure(MM.CAPACITY, (cluster.gpu.memory_gb,), "bytes"),
        "band": numbers.peak_band.to_dict(),
        "fits": numbers.fits,
        "rank_rule": RANK_RULE,
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
