"""The architecture advice against real CPU runs: the planner calibrated on runs of its own, then its predicted gain
for each suggestion beside the measured one.

    python -m bench.trainer.advice [--out DIR] [--steps N] [--repeats R]

1. Calibration: a handful of runs of the same model family on the same setup (1 process, 1 thread), none of them a
   compared variant — other depths, widths, micro-batches and expert counts — fitted by ``estimate.calibrate``;
   its leave-one-out error is printed beside the table.
2. The comparisons, each predicted by the planner under the fitted options (``Assessor(options=…)``):
   depth against width at equal parameters (``shapes.equal_parameter_shapes``); a mixture of experts against the
   dense model at equal active FLOPs (``shapes.moe_counterpart``); micro-batch 1 against 8 at the same global batch,
   on a smaller model of the family, whose step at b = 1 is mostly per-micro-batch host work.

A run's step time is the median of its steps after the warm-up, and a configuration's the least of those medians
over the repeats (``robust_step_s``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.trainer.common import fresh, sample_text
from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec
from trainer.contract.presets import local_cpu_cluster
from trainer.contract.records import step_times
from trainer.contract.runfolder import METRICS, read_jsonl
from trainer.planner.advice import shapes
from trainer.planner.advice.figures import Assessor
from trainer.planner.estimate.calibrate import ClusterCalibration, MeasuredRun, calibrate, step_terms
from trainer.planner.estimate.options import EstimateOptions

# A model big enough that its matmuls, not Python, take most of a CPU step, small enough for seconds a run.
BASE = ModelSpec(name="advice-bench", n_layers=4, d_model=128, n_heads=4, seq_len=128, vocab_size=512)
BASE_PLAN = ParallelPlan(micro_batch=8, global_batch=8)
# The micro-batch comparison needs a model whose b = 1 step is host-bound: at 4×128 one thread's GEMMs fill at
# b = 1 already and b1 against b8 is within the noise; at 2×64, seq 64 each micro-batch is mostly dispatch.
SMALL = BASE.replace(n_layers=2, d_model=64, seq_len=64)
CLUSTER = local_cpu_cluster(1)
WARMUP = 3      # steps left out: the first pay for allocation, the memory probe and the learning-rate warm-up
# Gains below this are "no difference" for the direction check: the CPU's run-to-run noise is a few percent.
FLAT = 0.03


@dataclass(frozen=True)
class Variant:
    comparison: str
    label: str
    model: ModelSpec
    plan: ParallelPlan

    @property
    def key(self) -> tuple[ModelSpec, ParallelPlan]:
        return self.model, self.plan


def variants(base: ModelSpec = BASE, plan: ParallelPlan = BASE_PLAN, small: ModelSpec = SMALL
             ) -> list[tuple[Variant, Variant]]:
    """(reference, variant) pairs: each equal-parameter shape, the MoE counterpart, and micro-batch 1 against 8 of
    the small model."""
    ref = Variant("", f"{base.n_layers}×{base.d_model}", base, plan)
    pairs = []
    for shape in shapes.equal_parameter_shapes(base):
        pairs.append((replace(ref, comparison="depth vs width"),
                      Variant("depth vs width", f"{shape.n_layers}×{shape.d_model}", shape, plan)))
    moe = shapes.moe_counterpart(base)
    if moe is not None:
        pairs.append((replace(ref, comparison="MoE vs dense", label="dense"),
                      Variant("MoE vs dense", f"MoE E{moe.n_experts} top-{moe.top_k} f{moe.ffn}", moe, plan)))
    one = plan.replace(micro_batch=1)
    name = f"{small.n_layers}×{small.d_model} s{small.seq_len}"
    pairs.append((Variant("micro-batch", f"{name} b{one.micro_batch}", small, one),
                  Variant("micro-batch", f"b{plan.micro_batch}", small, plan)))
    return pairs


def _calibration_moe(model: ModelSpec, experts: int) -> ModelSpec:
    moe = shapes.moe_counterpart(model, experts=experts)
    if moe is None:
        raise ValueError(f"no MoE counterpart of {model} with {experts} experts")
    return moe


def calibration_variants(base: ModelSpec = BASE, small: ModelSpec = SMALL, global_batch: int = 8) -> list[Variant]:
    """The runs the planner is fitted on: the same family at other depths, widths, micro-batches and expert counts,
    chosen so that every term the comparisons move is pinned by runs that vary it on their own — layers (L),
    micro-batches (M), width (the GEMM shape), experts (4, 8, 16 at two depths) — and none of them is a compared
    variant (tests/bench/trainer/test_advice.py checks)."""
    def plan(b: int) -> ParallelPlan:
        return ParallelPlan(micro_batch=b, global_batch=global_batch)

    runs = [(base.replace(n_layers=6), plan(8)), (base.replace(n_layers=2), plan(2)), (base, plan(4)),
            (base.replace(n_layers=3, d_model=160, n_heads=5), plan(8)),
            (small.replace(n_layers=3), plan(1)), (small.replace(n_layers=4), plan(4)),
            (_calibration_moe(base, 4), plan(8)), (_calibration_moe(base.replace(n_layers=2), 8), plan(4)),
            (_calibration_moe(base.replace(n_layers=2), 16), plan(8))]
    out = []
    for model, p in runs:
        label = f"{model.n_layers}×{model.d_model} s{model.seq_len} b{p.micro_batch}"
        out.append(Variant("calibration", label + (f" E{model.n_experts}" if model.is_moe else ""), model, p))
    return out


def fit(records: list[MeasuredRun]) -> ClusterCalibration:
    """The planner's time model fitted to the calibration runs, its terms chosen by leave-one-out (``calibrate``)."""
    clusters = calibrate(records).clusters
    if len(clusters) != 1:
        raise ValueError(f"the calibration runs must share one cluster, got {sorted(clusters)}")
    (fitted,) = clusters.values()
    return fitted


def predicted_step_s(variant: Variant, options: EstimateOptions | None = None) -> float:
    """The planner's step time of ``variant`` on the benchmark's CPU under ``options`` (the fitted ones)."""
    return Assessor(variant.model, variant.plan, CLUSTER, options).figures(variant.model, variant.plan).step_time_s


def gain(reference_step_s: float, variant_step_s: float) -> float:
    """Relative tokens/s gain of the variant at the same tokens a step: reference / variant − 1."""
    return reference_step_s / variant_step_s - 1


def direction(predicted: float, measured: float, flat: float = FLAT) -> str:
    """'same' when both gains have one sign (or both are within ±flat), 'opposite' otherwise; 'flat' names the
    side that saw no difference."""
    p = 0 if abs(predicted) < flat else (1 if predicted > 0 else -1)
    m = 0 if abs(measured) < flat else (1 if measured > 0 else -1)
    if p == m:
        return "same"
    if p == 0 or m == 0:
        return "predicted flat" if p == 0 else "measured flat"
    return "opposite"


def robust_step_s(runs_step_times: list[list[float]]) -> float:
    """One configuration's step time from its repeats' post-warm-up step times: the median within a run (a step
    that a collection, a page fault or another process slowed moves the median little, where the mean follows it),
    then the least over the repeats (other work on the machine only ever adds time, so the least disturbed repeat
    is the one that says what the shape costs)."""
    return min(statistics.median(times) for times in runs_step_times if times)


def _train(variant: Variant, dataset: DatasetSpec, out: Path, steps: int) -> list[float]:
    """One run of ``variant`` on one thread: its step times after the warm-up."""
    import torch  # torch only when measuring

    from trainer.engine.loop import run

    torch.set_num_threads(1)
    name = f"advice-{variant.comparison}-{variant.label}".replace(" ", "_").replace("×", "x")
    spec = RunSpec(model=variant.model, plan=variant.plan, cluster=CLUSTER, dataset=dataset,
                   output_dir=str(out / name), steps=steps, log_every=steps,
                   optimizer=OptimizerSpec(lr=3e-4, warmup_steps=2)).validate()
    run(spec, fresh(Path(spec.output_dir)), resume=False)
    return step_times([r for _, r in read_jsonl(Path(spec.output_dir) / METRICS)], after_step=WARMUP)


def measure_all(configs: list[Variant], dataset: DatasetSpec, out: Path, steps: int, repeats: int
                ) -> dict[tuple[ModelSpec, ParallelPlan], float]:
    """Every configuration ``repeats`` times, round-robin — each pass runs them all once, so that a slow spell of
    the machine falls on one repeat of many configurations, not on every repeat of one — then ``robust_step_s``."""
    unique = list({c.key: c for c in configs}.values())
    times: dict[tuple, list[list[float]]] = {c.key: [] for c in unique}
    for _ in range(repeats):
        for c in unique:
            times[c.key].append(_train(c, dataset, out, steps))
    return {key: robust_step_s(runs) for key, runs in times.items()}


def rows_for(pairs: list[tuple[Variant, Variant]], measured: dict, options: EstimateOptions) -> list[dict]:
    rows = []
    for ref, var in pairs:
        m_ref, m_var = measured[ref.key], measured[var.key]
        p_ref, p_var = predicted_step_s(ref, options), predicted_step_s(var, options)
        row = {"comparison": var.comparison, "reference": ref.label, "variant": var.label,
               "predicted_ref_ms": p_ref * 1e3, "predicted_ms": p_var * 1e3, "measured_ref_ms": m_ref * 1e3,
               "measured_ms": m_var * 1e3, "predicted_gain": gain(p_ref, p_var), "measured_gain": gain(m_ref, m_var)}
        row["direction"] = direction(row["predicted_gain"], row["measured_gain"])
        rows.append(row)
    return rows


def report(rows: list[dict]) -> str:
    lines = ["comparison      reference → variant              predicted ms        measured ms   predicted  measured"
             "  direction"]
    for r in rows:
        lines.append(f"{r['comparison']:15s} {r['reference'] + ' → ' + r['variant']:31s} "
                     f"{r['predicted_ref_ms']:7.1f} → {r['predicted_ms']:7.1f}  {r['measured_ref_ms']:6.1f} → "
                     f"{r['measured_ms']:6.1f}  {r['predicted_gain']:+9.1%}  {r['measured_gain']:+8.1%}  "
                     f"{r['direction']}")
    return "\n".join(lines)


def calibration_report(runs: list[Variant], records: list[MeasuredRun], fitted: ClusterCalibration) -> str:
    """Each calibration run's measured step and held-out error, the fit's error and the options it gives."""
    o = fitted.options
    # the communication terms are free in the chosen model but no run on one process exercises them
    base = EstimateOptions()
    exercised = {t for r in records for t, v in step_terms(r.model, r.cluster, r.plan, base).values.items() if v}
    terms = [t for t in fitted.time_terms if t in exercised]
    lines = [f"calibration: {fitted.runs} runs, fitted terms {', '.join(terms)}"]
    for v, r, err in zip(runs, records, fitted.time_errors):
        lines.append(f"  {v.label:24s} {r.step_time_s * 1e3:7.1f} ms   held out {err:6.1%}")
    e = fitted.time_error
    lines.append(f"  held-out step-time error (leave-one-out): median {e['median']:.1%}, mean {e['mean']:.1%}, "
                 f"max {e['max']:.1%}")
    lines.append(f"  fitted: compute_efficiency {o.compute_efficiency:.3f} of {CLUSTER.gpu.peak_tflops * 1e3:.0f} "
                 f"GFLOP/s, w½ {o.efficiency_half_work:,.0f}, layer {o.layer_overhead_s * 1e3:.3f} ms, micro-batch "
                 f"{o.microbatch_overhead_s * 1e3:.3f} ms, expert {o.expert_overhead_s * 1e3:.3f} ms, step "
                 f"{o.step_overhead_s * 1e3:.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer.advice", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "trainer-bench-advice"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps <= WARMUP + 2:
        parser.error(f"--steps must exceed the {WARMUP} warm-up steps by at least 3")
    from trainer.data import prepare_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = DatasetSpec(path=str(sample_text(out)), prepared_dir=str(out / "prepared"))
    prepare_dataset(dataset, BASE.vocab_size)
    started = time.perf_counter()
    pairs, calibration = variants(), calibration_variants()
    measured = measure_all(calibration + [v for pair in pairs for v in pair], dataset, out, args.steps,
                           args.repeats)
    records = [MeasuredRun(v.model, v.plan, CLUSTER, measured[v.key]) for v in calibration]
    fitted = fit(records)
    rows = rows_for(pairs, measured, fitted.options)
    print(f"base model: {BASE.n_layers} layers, d_model {BASE.d_model}, {BASE.n_heads} heads, seq {BASE.seq_len}, "
          f"vocab {BASE.vocab_size}; fp32, 1 CPU process on 1 thread, {args.steps} steps, the median after "
          f"{WARMUP}, least of {args.repeats} runs; gains in tokens/s at the same tokens a step\n")
    print(calibration_report(calibration, records, fitted) + "\n")
    print(report(rows))
    agree = sum(r["direction"] == "same" for r in rows)
    print(f"\n{agree} of {len(rows)} comparisons point the same way (|gain| < {FLAT:.0%} counts as flat); "
          f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
