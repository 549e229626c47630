"""Fit the planner's efficiency and overhead terms to measured runs, per cluster, and report held-out error.

Step time is linear in four unknowns once the planner has split it at ideal efficiency (compute_efficiency = 1,
comm_efficiency = 1, no latency, no fixed overhead):
    measured_step ≈ x_c · C + x_n · N + α · K + x_0
C is the compute time (with its share of the pipeline bubble), N the bandwidth time of communication (tensor,
pipeline, data parallel, all-to-all, offload and their bubble share), K the latency hops of the collectives a rank
issues per step (comm.collective_counts: an all-reduce over n ranks 2·(n−1), all-gather / reduce-scatter /
all-to-all n−1, a pipeline message 1; the in-stage tp and all-to-all ones weighted by 1 + bubble, as their time
is). Then
compute_efficiency = 1/x_c, comm_efficiency = 1/x_n, collective_latency_s = α and step_overhead_s = x_0
(``fit_latency=False``: α = 0, the bandwidth-only model). Peak memory is linear in two:
    measured_bytes − model_states ≈ overhead_bytes + (1 + fragmentation) · dynamic
with dynamic = activations in flight + buffers. Ordinary least squares (normal equations, solved by Gaussian
elimination; no numpy). Terms that come out non-physical (negative overheads, efficiency > 1) are pinned and the rest
refitted. Held-out error is leave-one-out: fit on all runs but one, predict that one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from trainer.planner.estimate.core import Planner, PlanNumbers
from trainer.planner.estimate.explain import validate_inputs
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError

_COMPUTE = ("compute",)
_COMM = ("tensor_parallel", "expert_all_to_all", "pipeline_p2p", "data_parallel", "offload")


@dataclass(frozen=True)
class MeasuredRun:
    model: ModelSpec
    plan: ParallelPlan
    cluster: ClusterSpec
    step_time_s: float
    memory_bytes: float | None = None   # measured peak bytes per GPU (None: not measured)


@dataclass
class ClusterCalibration:
    cluster: str
    runs: int
    options: EstimateOptions
    time_coefficients: dict[str, float]
    memory_coefficients: dict[str, float]
    time_error: dict[str, float] = field(default_factory=dict)     # leave-one-out relative error: mean, max
    memory_error: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "runs": self.runs, "options": self.options.to_dict(),
                "time_coefficients": self.time_coefficients, "memory_coefficients": self.memory_coefficients,
                "time_error": self.time_error, "memory_error": self.memory_error}


@dataclass
class Calibration:
    clusters: dict[str, ClusterCalibration]
    note: str = ("Least squares per cluster on step = C/compute_efficiency + N/comm_efficiency + "
                 "collectives·collective_latency + step_overhead and "
                 "memory = states + overhead_bytes + (1 + fragmentation)·dynamic; errors are leave-one-out.")

    def options_for(self, cluster: ClusterSpec) -> EstimateOptions:
        return self.clusters[_key(cluster)].options

    def to_dict(self) -> dict[str, Any]:
        return {"clusters": {k: v.to_dict() for k, v in self.clusters.items()}, "note": self.note}


def _key(cluster: ClusterSpec) -> str:
    return cluster.name or f"{cluster.nodes}x{cluster.gpus_per_node} {cluster.gpu.name}"


def solve_least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """argmin ‖A x − y‖² through the normal equations AᵀA x = Aᵀy (Gaussian elimination, partial pivoting)."""
    n = len(rows[0])
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    aty = [sum(r[i] * v for r, v in zip(rows, y)) for i in range(n)]
    scale = [max(abs(ata[i][i]), 1e-300) ** 0.5 for i in range(n)]  # equilibrate: seconds and bytes differ in size
    a = [[ata[i][j] / (scale[i] * scale[j]) for j in range(n)] + [aty[i] / scale[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            raise ValueError("the measured runs do not determine the fit (too few or too alike)")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * yv for x, yv in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] / scale[i] for i in range(n)]


def ideal_options(base: EstimateOptions) -> EstimateOptions:
    """``base`` at ideal efficiency and without overheads: the planner's raw compute and communication split."""
    return base.replace(compute_efficiency=1.0, comm_efficiency=1.0, step_overhead_s=0.0, dp_overlap=0.0,
                        overhead_bytes=0.0, fragmentation=0.0, collective_latency_s=0.0)


@dataclass(frozen=True, slots=True)
class TimeFeatures:
    """A plan's step at ideal options: C compute seconds (with its share of the pipeline bubble), N bandwidth
    seconds of communication (with the rest of the bubble) and K latency hops (``collective_feature``)."""

    compute_s: float
    communication_s: float
    latency_hops: float = 0.0

    @property
    def communication_share(self) -> float:
        return self.communication_s / (self.compute_s + self.communication_s or 1.0)


@dataclass(frozen=True)
class TimeFit:
    """step ≈ x_c·C + x_n·N + α·K + x_0; the defaults are the ideal options' own (x = 1, no latency or overhead)."""

    compute: float = 1.0          # x_c = 1 / compute_efficiency
    communication: float = 1.0    # x_n = 1 / comm_efficiency
    latency_s: float = 0.0        # α, seconds per ring step
    fixed_s: float = 0.0          # x_0, seconds per step

    def predict(self, f: TimeFeatures) -> float:
        return self.compute * f.compute_s + self.communication * f.communication_s + self.latency_s * f.latency_hops \
            + self.fixed_s


@dataclass(frozen=True, slots=True)
class StageBytes:
    """A pipeline stage's peak memory at ideal options: model states and the dynamic part (activations in flight +
    buffers)."""

    states: float
    dynamic: float


@dataclass(frozen=True)
class MemoryFit:
    """peak ≈ states + overhead_bytes + dynamic · (activations in flight + buffers); dynamic = 1 + fragmentation."""

    overhead_bytes: float = 0.0
    dynamic: float = 1.0

    def predict(self, stage: StageBytes) -> float:
        return stage.states + self.overhead_bytes + self.dynamic * stage.dynamic

    def peak(self, stages: Sequence[StageBytes]) -> StageBytes:
        """The stage that peaks under these terms."""
        return max(stages, key=self.predict)


def _features(numbers: PlanNumbers) -> TimeFeatures:
    """C and N take the bubble's share of what it stretches; K from ``collective_feature``."""
    t = numbers.time
    compute = sum(t.get(k, 0.0) for k in _COMPUTE)
    in_stage = compute + t.get("tensor_parallel", 0.0) + t.get("expert_all_to_all", 0.0)
    bubble = t.get("pipeline_bubble", 0.0)
    compute_share = bubble * compute / in_stage if in_stage else 0.0
    comm = sum(t.get(k, 0.0) for k in _COMM) + bubble - compute_share
    return TimeFeatures(compute + compute_share, comm, collective_feature(numbers))


def collective_feature(numbers: PlanNumbers) -> float:
    """K: the latency hops of a step (comm.collective_counts) as step time counts them — the tp and all-to-all ones
    run inside each micro-batch's work, which the pipeline bubble stretches by (p−1)/(v·m); pipeline messages and
    dp collectives once. Step time = … + α·K."""
    plan, calls = numbers.plan, numbers.latency_hops
    stretch = 1.0
    if plan.pp > 1:
        stretch += (plan.pp - 1) / (plan.model_chunks * plan.grad_accum)
    return (calls.get("tp", 0.0) + calls.get("ep", 0.0)) * stretch + calls.get("pp", 0.0) + calls.get("dp", 0.0)


def time_features(planner: Planner, plan: ParallelPlan) -> TimeFeatures:
    """C, N and K of one plan (``planner`` at ideal options)."""
    return _features(planner.evaluate(plan))


def _memory_features(planner: Planner, plan: ParallelPlan) -> list[StageBytes]:
    """Each pipeline stage the planner tracks (first, last)."""
    return [StageBytes(st.model_state_bytes, st.activations + sum(st.buffers.values()))
            for st in planner.evaluate(plan).stages]


def _fit_memory_peak(stages: list[list[StageBytes]], y: list[float]) -> MemoryFit:
    """The peak is the largest stage under the fitted terms: pick stages, fit, re-pick until it settles."""
    fit = MemoryFit()
    for _ in range(5):
        new = _fit_memory([fit.peak(st) for st in stages], y)
        if new == fit:
            break
        fit = new
    return fit


def _fit_time(features: list[TimeFeatures], y: list[float], latency: bool = True) -> TimeFit:
    """x_c ≥ 1, x_n ≥ 1, α ≥ 0 and x_0 ≥ 0, dropping terms the data cannot carry.

    A term that comes out non-physical is pinned (x = 1, α = 0, x_0 = 0) and the rest refitted, the fixed overhead
    first, then α, then communication: the fixed overhead is the least specific."""
    fixed = {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0}
    free = [0, 1, 2, 3] if latency else [0, 1, 3]
    full = [(f.compute_s, f.communication_s, f.latency_hops, 1.0) for f in features]
    while True:
        rows = [[r[i] for i in free] for r in full]
        target = [v - sum(fixed[i] * r[i] for i in fixed if i not in free) for r, v in zip(full, y)]
        usable = [i for i in free if any(abs(row[free.index(i)]) > 0 for row in rows)]
        if usable != free:
            free = usable
            continue
        if not free:
            return TimeFit()
        try:
            x = solve_least_squares(rows, target) if len(rows) >= len(free) else None
        except ValueError:
            x = None
        if x is None:  # too few runs: drop the last free term (overhead, then α, then communication)
            free = free[:-1]
            continue
        sol = dict(zip(free, x))
        bad = [i for i in free if (i < 2 and sol[i] < 1.0) or (i >= 2 and sol[i] < 0.0)]
        if not bad:
            return TimeFit(*(sol.get(i, fixed[i]) for i in range(4)))
        free = [i for i in free if i != bad[-1]]


def _fit_memory(features: list[StageBytes], y: list[float]) -> MemoryFit:
    """Both terms non-negative and the slope ≥ 1."""
    target = [v - f.states for f, v in zip(features, y)]
    try:
        if len(y) >= 2:
            c0, c1 = solve_least_squares([(1.0, f.dynamic) for f in features], target)
            if c0 >= 0 and c1 >= 1:
                return MemoryFit(c0, c1)
    except ValueError:
        pass
    c0 = max(0.0, sum(v - f.dynamic for f, v in zip(features, target)) / len(target))
    return MemoryFit(c0, 1.0)


def _relative_errors(errors: list[float]) -> dict[str, float]:
    return {"mean": sum(errors) / len(errors), "max": max(errors), "runs": len(errors)} if errors else {}


def _leave_one_out(n: int, held_out_error) -> list[float]:
    """Each run's error when the fit leaves it out; none below two runs."""
    return [held_out_error(i) for i in range(n)] if n >= 2 else []


def calibrate(records: Sequence[MeasuredRun], base: EstimateOptions | None = None,
              fit_latency: bool = True) -> Calibration:
    """Per cluster: fitted EstimateOptions, the coefficients, and leave-one-out relative errors.

    ``fit_latency=False`` fits the bandwidth-only model (α = 0), the planner's time model before the α term."""
    if not records:
        raise SpecError.single("records", "calibration needs at least one measured run")
    base = base or EstimateOptions()
    ideal = ideal_options(base)
    groups: dict[str, list[MeasuredRun]] = {}
    for i, r in enumerate(records):
        if not isinstance(r, MeasuredRun):
            raise SpecError.single(f"records[{i}]", f"expected a MeasuredRun, got {type(r).__name__}")
        validate_inputs(r.model, r.plan, r.cluster)
        if not r.step_time_s > 0:
            raise SpecError.single(f"records[{i}].step_time_s", f"step_time_s={r.step_time_s} must be positive")
        groups.setdefault(_key(r.cluster), []).append(r)
    return Calibration({key: _calibrate_cluster(key, runs, base, ideal, fit_latency) for key, runs in groups.items()})


def _calibrate_cluster(key: str, runs: list[MeasuredRun], base: EstimateOptions, ideal: EstimateOptions,
                       fit_latency: bool) -> ClusterCalibration:
    tf = [time_features(Planner(r.model, r.cluster, ideal), r.plan) for r in runs]
    ty = [r.step_time_s for r in runs]
    mem_runs = [r for r in runs if r.memory_bytes is not None]
    mf = [_memory_features(Planner(r.model, r.cluster, ideal), r.plan) for r in mem_runs]
    my = [r.memory_bytes for r in mem_runs]
    time_fit = _fit_time(tf, ty, fit_latency)
    memory_fit = _fit_memory_peak(mf, my) if mf else MemoryFit(base.overhead_for(runs[0].cluster.gpu.name),
                                                               1 + base.fragmentation)
    options = base.replace(compute_efficiency=min(1.0, 1 / time_fit.compute),
                           comm_efficiency=min(1.0, 1 / time_fit.communication),
                           collective_latency_s=time_fit.latency_s, step_overhead_s=time_fit.fixed_s, dp_overlap=0.0,
                           overhead_bytes=memory_fit.overhead_bytes, fragmentation=memory_fit.dynamic - 1)

    def time_error(i: int) -> float:
        held_out = _fit_time(tf[:i] + tf[i + 1:], ty[:i] + ty[i + 1:], fit_latency)
        return abs(held_out.predict(tf[i]) - ty[i]) / ty[i]

    def memory_error(i: int) -> float:
        held_out = _fit_memory_peak(mf[:i] + mf[i + 1:], my[:i] + my[i + 1:])
        return abs(held_out.predict(held_out.peak(mf[i])) - my[i]) / my[i]

    return ClusterCalibration(key, len(runs), options, asdict(time_fit), asdict(memory_fit),
                              _relative_errors(_leave_one_out(len(runs), time_error)),
                              _relative_errors(_leave_one_out(len(mf), memory_error)))
