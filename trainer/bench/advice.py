"""The architecture advice against real CPU runs: three suggestions whose effect a CPU shows, each variant trained
for a few steps in one process, the planner's predicted gain beside the measured one.

    python -m trainer.bench.advice [--out DIR] [--steps N]

1. depth against width at equal parameters (``shapes.equal_parameter_shapes``);
2. a mixture of experts against the dense model at equal active FLOPs (``shapes.moe_counterpart``);
3. micro-batch 1 against 8 at the same global batch.

The prediction for a variant is the planner's own estimate on ``presets.local_cpu_cluster(1)`` (the CPU device has
no tile figures, so the matmul-shape refinement is off); the measurement is the fastest step after the warm-up.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from trainer.bench.common import fresh, sample_text
from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec
from trainer.contract.presets import local_cpu_cluster
from trainer.contract.records import step_times
from trainer.contract.runfolder import METRICS, read_jsonl
from trainer.planner.advice import shapes
from trainer.planner.advice.figures import Assessor

# A model big enough that its matmuls, not Python, take most of a CPU step, small enough for seconds a run.
BASE = ModelSpec(name="advice-bench", n_layers=4, d_model=128, n_heads=4, seq_len=128, vocab_size=512)
BASE_PLAN = ParallelPlan(micro_batch=8, global_batch=8)
# Gains below this are "no difference" for the direction check: the CPU's run-to-run noise is a few percent.
FLAT = 0.03


@dataclass(frozen=True)
class Variant:
    comparison: str
    label: str
    model: ModelSpec
    plan: ParallelPlan


def variants(base: ModelSpec = BASE, plan: ParallelPlan = BASE_PLAN) -> list[tuple[Variant, Variant]]:
    """(reference, variant) pairs: each equal-parameter shape, the MoE counterpart, and micro-batch 1 against 8."""
    ref = Variant("", f"{base.n_layers}×{base.d_model}", base, plan)
    pairs = []
    for shape in shapes.equal_parameter_shapes(base):
        pairs.append((replace(ref, comparison="depth vs width"),
                      Variant("depth vs width", f"{shape.n_layers}×{shape.d_model}", shape, plan)))
    moe = shapes.moe_counterpart(base)
    if moe is not None:
        pairs.append((replace(ref, comparison="MoE vs dense", label="dense"),
                      Variant("MoE vs dense", f"MoE E{moe.n_experts} top-{moe.top_k} f{moe.ffn}", moe, plan)))
    small = plan.replace(micro_batch=1)
    pairs.append((Variant("micro-batch", f"b{small.micro_batch}", base, small),
                  Variant("micro-batch", f"b{plan.micro_batch}", base, plan)))
    return pairs


def predicted_step_s(variant: Variant) -> float:
    cluster = local_cpu_cluster(variant.plan.world_size)
    return Assessor(variant.model, variant.plan, cluster).figures(variant.model, variant.plan).step_time_s


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


def fastest_step_s(run_dir: Path, skip: int = 2) -> float:
    """The fastest step after the first ``skip``: on a machine whose cores other work shares, the step that ran
    undisturbed is the one that says what the shape costs (the median drifts with the other work)."""
    return min(step_times([r for _, r in read_jsonl(run_dir / METRICS)], after_step=skip))


def measure(variant: Variant, dataset: DatasetSpec, out: Path, steps: int, repeats: int = 2) -> float:
    """The fastest step after two warm-up steps, over ``repeats`` runs, on one thread."""
    import torch  # torch only when measuring

    from trainer.engine.loop import run

    torch.set_num_threads(1)
    spec = RunSpec(model=variant.model, plan=variant.plan, cluster=local_cpu_cluster(1), dataset=dataset,
                   output_dir=str(out / f"advice-{variant.comparison}-{variant.label}".replace(" ", "_")),
                   steps=steps, log_every=steps, optimizer=OptimizerSpec(lr=3e-4, warmup_steps=2)).validate()
    best = []
    for _ in range(repeats):
        run(spec, fresh(Path(spec.output_dir)), resume=False)
        best.append(fastest_step_s(Path(spec.output_dir)))
    return min(best)


def report(rows: list[dict]) -> str:
    lines = ["comparison      reference → variant           predicted ms        measured ms   predicted  measured"
             "  direction"]
    for r in rows:
        lines.append(f"{r['comparison']:15s} {r['reference'] + ' → ' + r['variant']:28s} "
                     f"{r['predicted_ref_ms']:7.1f} → {r['predicted_ms']:7.1f}  {r['measured_ref_ms']:6.1f} → "
                     f"{r['measured_ms']:6.1f}  {r['predicted_gain']:+9.1%}  {r['measured_gain']:+8.1%}  "
                     f"{r['direction']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench.advice", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "trainer-bench-advice"))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    from trainer.data import prepare_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = DatasetSpec(path=str(sample_text(out)), prepared_dir=str(out / "prepared"))
    prepare_dataset(dataset, BASE.vocab_size)
    started = time.perf_counter()
    measured: dict[tuple[ModelSpec, ParallelPlan], float] = {}  # a reference shared by comparisons runs once
    rows = []
    for ref, var in variants():
        for v in (ref, var):
            if (v.model, v.plan) not in measured:
                measured[(v.model, v.plan)] = measure(v, dataset, out, args.steps)
        m_ref, m_var = measured[(ref.model, ref.plan)], measured[(var.model, var.plan)]
        p_ref, p_var = predicted_step_s(ref), predicted_step_s(var)
        rows.append({"comparison": var.comparison, "reference": ref.label, "variant": var.label,
                     "predicted_ref_ms": p_ref * 1e3, "predicted_ms": p_var * 1e3, "measured_ref_ms": m_ref * 1e3,
                     "measured_ms": m_var * 1e3, "predicted_gain": gain(p_ref, p_var),
                     "measured_gain": gain(m_ref, m_var)})
        rows[-1]["direction"] = direction(rows[-1]["predicted_gain"], rows[-1]["measured_gain"])
    print(f"base model: {BASE.n_layers} layers, d_model {BASE.d_model}, {BASE.n_heads} heads, seq {BASE.seq_len}, "
          f"vocab {BASE.vocab_size}; fp32, 1 CPU process on 1 thread, {args.steps} steps, the fastest after 2, best of 2 runs; "
          f"gains in tokens/s at the same tokens a step\n")
    print(report(rows))
    agree = sum(r["direction"] == "same" for r in rows)
    print(f"\n{agree} of {len(rows)} comparisons point the same way (|gain| < {FLAT:.0%} counts as flat); "
          f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
