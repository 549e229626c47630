"""Fit the planner's efficiency, latency and overhead terms to measured runs, per cluster, and report held-out error.

The step-time model (``Planner.step_time``) is linear in its per-cluster coefficients once the plan is fixed, so
each measured run gives one linear equation. Its terms, by what they physically are:

    step ≈ x_c · C + x_s · S + x_n · N + α · K + h_l · L + h_m · M + h_e · X + c_tp · Q_tp + c_dp · Q_dp + c_pp · Q_pp
           + x_0 + R

    C      compute seconds at the device's peak (hardware FLOPs of the slowest stage / peak), with the bubble's share
    S      C / w: the GEMM-shape term. A layer's matmuls are (b·s tokens) × (h/t or f/t columns), w = b·s·h/t; each
           pays w½/w of its FLOPs' time again (tiles that do not fill the units, set-up), so efficiency
           = compute_efficiency · w/(w + w½) and x_c·C + x_s·S = C·(1 + w½/w)/compute_efficiency
    N      bandwidth seconds of communication (tp, all-to-all, pipeline, data parallel) at the links' full rate
    K      latency hops, the ring steps of every collective (comm.collective_counts); α seconds each
    L      layer passes a rank dispatches: micro-batches × layers per stage (× 1.5 with full recompute); h_l is the
           host's fixed cost of a layer's forward and backward (Python, autograd, operator launches)
    M      micro-batches; h_m the host cost of one outside the layers (embedding, head, loss, schedule)
    X      expert passes: micro-batches × MoE layers per stage × experts a rank holds (× 1.5 with full recompute);
           h_e the host cost of one expert's forward and backward (the layer runs its experts one by one, each its
           own small GEMMs on its capacity rows); 0 for dense runs, so only records with experts fit it
    Q_*    collective calls by kind — tensor-parallel all-reduces (DTensor), data-parallel collectives (FSDP2
           all-gathers / reduce-scatters with their hooks, DDP buckets), pipeline messages (gloo point-to-point);
           c_* each call's fixed host cost on top of α per ring step
    x_0    fixed seconds a step (optimizer, synchronisation)
    R      what no coefficient scales (CPU offload over PCIe and the host optimizer, at their own rates)

Whatever stretches a micro-batch's work (the pipeline bubble of each schedule, in the schedule's own terms) stretches
C, S, L, M, X, Q_tp and the tp/all-to-all part of N and K too, because every feature is read off the planner itself:
the step at ideal options (no overhead, no latency, efficiencies 1, w½ = 0) and its change when one coefficient is
set to 1 (``step_terms``). A fit therefore means the same thing as the options it gives back:
compute_efficiency = 1/x_c, efficiency_half_work = x_s/x_c, comm_efficiency = 1/x_n, collective_latency_s = α,
layer_overhead_s = h_l, microbatch_overhead_s = h_m, expert_overhead_s = h_e, tp/dp/pp_call_s = c_*, step_overhead_s = x_0, and
``Planner(model, cluster, options).evaluate(plan).step_s`` is the fit's prediction.

Fitting is non-negative least squares (Lawson–Hanson active set; pure Python) on relative residuals — each run's
equation divided by its measured time, since the error that matters is relative and the runs span 40 ms to 1.5 s —
with x_c ≥ 1 and x_n ≥ 1 (no better than peak) and every other term ≥ 0. A term no run exercises (no tensor
parallel run: Q_tp = 0 everywhere) keeps the base options' value. ``terms`` chooses which coefficients are free;
``TODAY_TERMS`` is the four-term model the planner had before (x_c·C + x_n·N + α·K + x_0 with w½ the base's).

Peak memory is linear in two:
    measured_bytes − model_states ≈ overhead_bytes + (1 + fragmentation) · dynamic
with dynamic = activations in flight + buffers, on the stage that peaks under the fitted terms.

Held-out error is leave-one-out: fit on all runs but one, predict that one; reported as median, mean and max of
|predicted − measured| / measured. Beyond LEAVE_ONE_OUT_RUNS runs it is 10-fold cross-validation (each run still
predicted once, by the fit that left its fold out): leave-one-out repeats the choice of terms, itself n fits, for
each of n runs, and took a worker ten seconds a refit at 180 runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any, Sequence

from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.memory import fixed_overheads
from trainer.planner.estimate.explain import validate_inputs
from trainer.planner.estimate.options import EstimateOptions
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError

# The fitted coefficients: (name, lower bound, the option a unit of it is, how the option follows from the fit).
# "compute" and "communication" are reciprocals of efficiencies (x = 1/efficiency ≥ 1); the rest are seconds.
TERMS = ("compute", "compute_shape", "communication", "latency", "layer", "microbatch", "expert", "tp_call",
         "dp_call", "pp_call", "fixed")
TODAY_TERMS = ("compute", "communication", "latency", "fixed")
_LOWER = {"compute": 1.0, "communication": 1.0}
_SECONDS_OPTION = {"latency": "collective_latency_s", "layer": "layer_overhead_s",
                   "microbatch": "microbatch_overhead_s", "expert": "expert_overhead_s", "tp_call": "tp_call_s", "dp_call": "dp_call_s",
                   "pp_call": "pp_call_s", "fixed": "step_overhead_s"}


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
    time_error: dict[str, float] = field(default_factory=dict)     # leave-one-out relative error: median, mean, max
    memory_error: dict[str, float] = field(default_factory=dict)
    time_errors: list[float] = field(default_factory=list)         # each run's held-out error, in record order
    time_terms: tuple[str, ...] = ()                                # the free terms of the fit (the rest pinned)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "runs": self.runs, "options": self.options.to_dict(),
                "time_coefficients": self.time_coefficients, "memory_coefficients": self.memory_coefficients,
                "time_error": self.time_error, "memory_error": self.memory_error, "time_errors": self.time_errors,
                "time_terms": list(self.time_terms)}


@dataclass
class Calibration:
    clusters: dict[str, ClusterCalibration]
    note: str = ("Non-negative least squares per cluster on step = C·(1 + w½/w)/compute_efficiency + "
                 "N/comm_efficiency + α·hops + per-call costs by kind + host overhead per layer, micro-batch and "
                 "expert + step_overhead, and memory = states + overhead_bytes + (1 + fragmentation)·dynamic; errors are "
                 "leave-one-out.")

    def options_for(self, cluster: ClusterSpec) -> EstimateOptions:
        return self.clusters[cluster_key(cluster)].options

    def to_dict(self) -> dict[str, Any]:
        return {"clusters": {k: v.to_dict() for k, v in self.clusters.items()}, "note": self.note}


def cluster_key(cluster: ClusterSpec) -> str:
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


def non_negative_least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """argmin ‖A x − y‖² subject to x ≥ 0 (Lawson and Hanson's active-set method).

    Columns move into the free set one at a time, the one the residual pulls hardest first; a step that would make
    a free coefficient negative stops at the bound and releases it. A column that the free ones already span
    (collinear: nothing left to determine) is left at 0."""
    n = len(rows[0])
    x = [0.0] * n
    free: list[int] = []
    refused: set[int] = set()
    tol = 1e-12 * max(1.0, sum(abs(v) for v in y))

    def gradient(xv):
        residual = [v - sum(r[j] * xv[j] for j in range(n)) for r, v in zip(rows, y)]
        return [sum(r[j] * e for r, e in zip(rows, residual)) for j in range(n)]

    for _ in range(3 * n + 10):
        w = gradient(x)
        candidates = [j for j in range(n) if j not in free and j not in refused and w[j] > tol]
        if not candidates:
            break
        free.append(max(candidates, key=lambda j: w[j]))
        while True:
            try:
                z_free = solve_least_squares([[r[j] for j in free] for r in rows], y)
            except ValueError:
                refused.add(free.pop())
                break
            if all(v > 0 for v in z_free):
                for j in range(n):
                    x[j] = 0.0
                for j, v in zip(free, z_free):
                    x[j] = v
                break
            # step from x towards z only as far as the first coefficient that reaches 0
            steps = [x[j] / (x[j] - v) for j, v in zip(free, z_free) if v <= 0 and x[j] - v > 0]
            t = min(steps) if steps else 0.0
            for j, v in zip(free, z_free):
                x[j] += t * (v - x[j])
            free = [j for j in free if x[j] > 1e-15]
            for j in range(n):
                if j not in free:
                    x[j] = 0.0
            if not free:
                break
    return x


def ideal_options(base: EstimateOptions) -> EstimateOptions:
    """``base`` at ideal efficiency and without overheads: the planner's raw compute and communication split."""
    return base.replace(compute_model="efficiency", compute_efficiency=1.0, comm_efficiency=1.0, step_overhead_s=0.0,
                        dp_overlap=0.0,
                        overhead_bytes=0.0, fragmentation=0.0, collective_latency_s=0.0, tp_call_s=0.0,
                        dp_call_s=0.0, pp_call_s=0.0, layer_overhead_s=0.0, microbatch_overhead_s=0.0,
                        expert_overhead_s=0.0)


@dataclass(frozen=True)
class TimeFit:
    """Coefficients of the step-time terms (module docstring); the defaults are the ideal options' own."""

    compute: float = 1.0          # x_c = 1 / compute_efficiency
    communication: float = 1.0    # x_n = 1 / comm_efficiency
    latency_s: float = 0.0        # α, seconds per ring step
    fixed_s: float = 0.0          # x_0, seconds per step
    compute_shape: float = 0.0    # x_s = efficiency_half_work / compute_efficiency
    layer_s: float = 0.0          # h_l, host seconds per layer pass
    microbatch_s: float = 0.0     # h_m, host seconds per micro-batch
    expert_s: float = 0.0         # h_e, host seconds per expert pass (an expert of an MoE layer, a micro-batch)
    tp_call_s: float = 0.0        # c_tp, c_dp, c_pp: seconds per collective call
    dp_call_s: float = 0.0
    pp_call_s: float = 0.0

    def predict(self, f: "StepTerms") -> float:
        return f.rest_s + sum(self.coefficient(name) * f.values[name] for name in TERMS)

    def coefficient(self, term: str) -> float:
        return getattr(self, _FIT_FIELD[term])

    def options(self, base: EstimateOptions) -> EstimateOptions:
        """The EstimateOptions under which the planner predicts what this fit does."""
        seconds = {option: self.coefficient(term) for term, option in _SECONDS_OPTION.items()}
        return base.replace(compute_model="efficiency", compute_efficiency=1 / self.compute,
                            comm_efficiency=1 / self.communication,
                            efficiency_half_work=self.compute_shape / self.compute, dp_overlap=0.0, **seconds)

    def to_dict(self) -> dict[str, float]:
        return {term: self.coefficient(term) for term in TERMS}


_FIT_FIELD = {"compute": "compute", "compute_shape": "compute_shape", "communication": "communication",
              "latency": "latency_s", "layer": "layer_s", "microbatch": "microbatch_s", "expert": "expert_s",
              "tp_call": "tp_call_s", "dp_call": "dp_call_s", "pp_call": "pp_call_s", "fixed": "fixed_s"}


@dataclass(frozen=True)
class StepTerms:
    """One plan's features: ``values[term]`` is what a unit of that term's coefficient adds to the step, read off
    the planner (module docstring); ``rest_s`` what no coefficient scales."""

    values: dict[str, float]
    rest_s: float

    @property
    def communication_share(self) -> float:
        """What of the step at ideal options is communication rather than compute."""
        compute, communication = self.values["compute"], self.values["communication"]
        return communication / (compute + communication or 1.0)


def step_terms(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, base: EstimateOptions) -> StepTerms:
    """The features of ``plan``: the step at ideal options (efficiencies 1, w½ = 0, nothing else) and how much it
    grows when one coefficient is set to 1 — the planner is linear in each, so these are exact."""
    return plans_step_terms(model, cluster, [plan], base)[0]


def plans_step_terms(model: ModelSpec, cluster: ClusterSpec, plans: Sequence[ParallelPlan],
                     base: EstimateOptions) -> list[StepTerms]:
    """``step_terms`` of each of ``plans`` of one model on one cluster, each planner built once."""
    ideal = ideal_options(base).replace(efficiency_half_work=0.0)
    units = {"zero": {}, "compute": dict(compute_efficiency=0.5),        # doubling compute time adds C
             "communication": dict(comm_efficiency=0.5),                # doubling bandwidth time adds N
             "compute_shape": dict(efficiency_half_work=1.0)}           # C·(1 + 1/w) − C = C/w
    units.update({term: {option: 1.0} for term, option in _SECONDS_OPTION.items() if term != "fixed"})
    planners = {name: Planner(model, cluster, ideal.replace(**unit)) for name, unit in units.items()}
    out = []
    for plan in plans:
        zero = planners["zero"].evaluate(plan).step_s
        values = {name: planner.evaluate(plan).step_s - zero for name, planner in planners.items() if name != "zero"}
        values["fixed"] = 1.0
        out.append(StepTerms(values, zero - values["compute"] - values["communication"]))
    return out


def fit_time(features: Sequence[StepTerms], y: Sequence[float], terms: Sequence[str] = TERMS,
             base: EstimateOptions | None = None) -> TimeFit:
    """The coefficients of ``terms`` by non-negative least squares on relative residuals (module docstring).

    A term outside ``terms``, or one no run exercises, keeps the base options' value (w½ the base's too when
    "compute_shape" is not free: it then scales with x_c)."""
    base = base or EstimateOptions()
    fixed = {term: getattr(base, option) for term, option in _SECONDS_OPTION.items()}
    fixed.update(compute=1 / base.compute_efficiency, communication=1 / base.comm_efficiency,
                 compute_shape=base.efficiency_half_work / base.compute_efficiency)
    shape_with_compute = "compute" in terms and "compute_shape" not in terms
    free = [t for t in terms if any(f.values[t] for f in features)]
    if shape_with_compute:  # x_c·(C + w½·S): today's one efficiency at the base's shape
        w_half = base.efficiency_half_work

        def column(f: StepTerms, t: str) -> float:
            return f.values[t] + (w_half * f.values["compute_shape"] if t == "compute" else 0.0)
    else:
        def column(f: StepTerms, t: str) -> float:
            return f.values[t]
    rows, target = [], []
    for f, v in zip(features, y):
        known = f.rest_s + sum(fixed[t] * f.values[t] for t in TERMS if t not in free
                               and not (shape_with_compute and t == "compute_shape"))
        lower = sum(_LOWER.get(t, 0.0) * column(f, t) for t in free)
        rows.append([column(f, t) / v for t in free])
        target.append((v - known - lower) / v)
    solved = dict(fixed)
    if free and rows:
        for t, z in zip(free, non_negative_least_squares(rows, target)):
            solved[t] = _LOWER.get(t, 0.0) + z
    if shape_with_compute:
        solved["compute_shape"] = solved["compute"] * base.efficiency_half_work
    return TimeFit(**{_FIT_FIELD[t]: solved[t] for t in TERMS})


# The models a fit chooses from, fewest terms first: what a step costs at all (compute and a fixed part); the
# per-call costs by kind and the GEMM shape; ring-step latency and host overhead per layer, micro-batch and expert;
# and every term. Each adds what the one before cannot express; few records cannot carry the last ones.
MODELS: tuple[tuple[str, ...], ...] = (
    ("compute", "fixed"),
    ("compute", "compute_shape", "tp_call", "dp_call", "pp_call", "fixed"),
    ("compute", "compute_shape", "latency", "tp_call", "dp_call", "pp_call", "layer", "microbatch", "expert",
     "fixed"),
    TERMS,
)
# Trial mode (tune.trials) measures a handful of plans of one model on one cluster, three to a third of its pool,
# and must rank the rest: what sets them apart is how much of each step is compute and how much communication, so
# it frees those two and keeps every other term at the tuner's options. Host overheads, latency and per-call costs
# move with the same degrees as those two across such plans (nearly collinear on a few points), and choosing among
# MODELS by leave-one-out on three to ten runs picks on noise.
TRIAL_TERMS = ("compute", "communication")


LEAVE_ONE_OUT_RUNS = 25
FOLDS = 10


def held_out_folds(n: int) -> list[list[int]]:
    """The runs each held-out fit leaves out, every run in one: alone up to LEAVE_ONE_OUT_RUNS runs, else in FOLDS
    folds (run i in fold i mod FOLDS). None below two runs."""
    if n < 2:
        return []
    if n <= LEAVE_ONE_OUT_RUNS:
        return [[i] for i in range(n)]
    return [list(range(k, n, FOLDS)) for k in range(FOLDS)]


def _held_out(n: int, fit_without, error_of) -> list[float]:
    """Each run's error (``error_of(fit, i)``) under the fit that left its fold out (``fit_without(kept)``), in run
    order; none below two runs."""
    errors = [0.0] * n if n >= 2 else []
    for fold in held_out_folds(n):
        left_out = set(fold)
        fit = fit_without([i for i in range(n) if i not in left_out])
        for i in fold:
            errors[i] = error_of(fit, i)
    return errors


def _held_out_errors(features: Sequence[StepTerms], y: Sequence[float], terms: Sequence[str],
                     base: EstimateOptions) -> list[float]:
    return _held_out(len(y), lambda kept: fit_time([features[i] for i in kept], [y[i] for i in kept], terms, base),
                     lambda fit, i: abs(fit.predict(features[i]) - y[i]) / y[i])


def choose_terms(features: Sequence[StepTerms], y: Sequence[float], base: EstimateOptions,
                 models: Sequence[Sequence[str]] = MODELS) -> tuple[str, ...]:
    """The model of ``models`` whose held-out median error on these runs is lowest (the simpler one on a tie,
    within 1 %): as many terms as the records can carry. Fewer than three runs: the first."""
    if len(y) < 3:
        return tuple(models[0])
    best, best_error = tuple(models[0]), float("inf")
    for terms in models:
        error = median(_held_out_errors(features, y, terms, base))
        if error < best_error - 0.01:
            best, best_error = tuple(terms), error
    return best


def fit_chosen(features: Sequence[StepTerms], y: Sequence[float], base: EstimateOptions,
               terms: Sequence[str] | None) -> TimeFit:
    """``fit_time`` on ``terms``, or on the model ``choose_terms`` picks when they are None."""
    return fit_time(features, y, terms if terms is not None else choose_terms(features, y, base), base)


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


def relative_errors(errors: list[float]) -> dict[str, float]:
    """median, mean and max of relative errors, and how many."""
    if not errors:
        return {}
    return {"median": median(errors), "mean": sum(errors) / len(errors), "max": max(errors), "runs": len(errors)}


def calibrate(records: Sequence[MeasuredRun], base: EstimateOptions | None = None,
              fit_latency: bool = True, terms: Sequence[str] | None = None) -> Calibration:
    """Per cluster: fitted EstimateOptions, the coefficients, and leave-one-out relative errors.

    ``terms``: the free coefficients; None (the default) lets each fit choose among ``MODELS`` by leave-one-out on
    its own runs — the held-out error then counts that choice too, made without the held-out run;
    ``TODAY_TERMS``: the four-term model. ``fit_latency=False`` keeps α at 0 as well (the bandwidth-only model)."""
    if not records:
        raise SpecError.single("records", "calibration needs at least one measured run")
    unknown = sorted(set(terms or ()) - set(TERMS))
    if unknown:
        raise SpecError.single("terms", f"unknown term(s) {unknown}; known: {list(TERMS)}")
    base = base or EstimateOptions()
    if not fit_latency:
        terms = [t for t in (terms if terms is not None else TERMS) if t != "latency"]
        base = base.replace(collective_latency_s=0.0)
    groups: dict[str, list[MeasuredRun]] = {}
    for i, r in enumerate(records):
        if not isinstance(r, MeasuredRun):
            raise SpecError.single(f"records[{i}]", f"expected a MeasuredRun, got {type(r).__name__}")
        validate_inputs(r.model, r.plan, r.cluster)
        if not r.step_time_s > 0:
            raise SpecError.single(f"records[{i}].step_time_s", f"step_time_s={r.step_time_s} must be positive")
        groups.setdefault(cluster_key(r.cluster), []).append(r)
    chosen = tuple(terms) if terms is not None else None
    return Calibration({key: _calibrate_cluster(key, runs, base, chosen) for key, runs in groups.items()})


def _calibrate_cluster(key: str, runs: list[MeasuredRun], base: EstimateOptions,
                       terms: tuple[str, ...] | None) -> ClusterCalibration:
    ideal = ideal_options(base)
    tf = [step_terms(r.model, r.cluster, r.plan, base) for r in runs]
    ty = [r.step_time_s for r in runs]
    mem_runs = [r for r in runs if r.memory_bytes is not None]
    mf = [_memory_features(Planner(r.model, r.cluster, ideal), r.plan) for r in mem_runs]
    my = [r.memory_bytes for r in mem_runs]
    chosen = terms if terms is not None else choose_terms(tf, ty, base)
    time_fit = fit_time(tf, ty, chosen, base)
    # without measured peaks, the base's overheads as expected (of a distributed run on the runs' GPU)
    memory_fit = _fit_memory_peak(mf, my) if mf else MemoryFit(
        sum(band.expected for band in fixed_overheads(runs[0].cluster.gpu.name != "cpu", True,
                                                      base.overhead_bytes).values()), 1 + base.fragmentation)
    options = time_fit.options(base).replace(overhead_bytes=memory_fit.overhead_bytes,
                                             fragmentation=memory_fit.dynamic - 1)

    time_errors = _held_out(
        len(runs), lambda kept: fit_chosen([tf[i] for i in kept], [ty[i] for i in kept], base, terms),
        lambda fit, i: abs(fit.predict(tf[i]) - ty[i]) / ty[i])
    memory_errors = _held_out(
        len(mf), lambda kept: _fit_memory_peak([mf[i] for i in kept], [my[i] for i in kept]),
        lambda fit, i: abs(fit.predict(fit.peak(mf[i])) - my[i]) / my[i])
    return ClusterCalibration(key, len(runs), options, time_fit.to_dict(),
                              {"overhead_bytes": memory_fit.overhead_bytes, "dynamic": memory_fit.dynamic},
                              relative_errors(time_errors), relative_errors(memory_errors), time_errors,
                              tuple(chosen))
