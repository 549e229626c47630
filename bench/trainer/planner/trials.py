"""Benchmark: does trial mode pick a plan within 5 % of the best, measuring at most a third of a real CPU grid?

    python -m bench.trainer.planner.trials [--root DIR] [--steps 20] [--warmup 5] [--remeasure] [--json OUT]
                                          [--replay OUT.json] [--calibration-runs OUT.json]

The grid: 16 plans of the "tiny" preset (4 layers, d_model 64, 16 sequences of 64 tokens a step, fp32, native
engine) on 2 and 4 local processes — data parallel (DDP, FSDP2), tensor parallel with and without
sequence parallel, pipelines (GPipe, 1F1B, interleaved), their 4-process combinations, micro-batch and activation
checkpointing variations. Every plan comes out of the tuner's own enumeration (the contract's rules) and its RunSpec
is validated before launch.

1. Ground truth: every plan is measured by a short real run (``LocalTrials``: the trainer under torchrun on gloo).
2. Trial mode: ``run_trials`` over the grid ordered by the planner's estimate, with max_fraction 1/3 and the
   (compute, communication) features ``tune`` gives it. Its ``measure`` answers from the ground-truth measurements
   of step 1 — only for the plans trial mode asks for, one at a time, so the strategy sees nothing it did not pay
   for. Reusing the numbers is what makes "picked" and "best of all measured" comparable: a second run of the same
   plan differs by a few per cent or more when other processes share the cores, and that noise would otherwise be
   scored as the strategy's error. ``--remeasure`` runs trial mode's measurements for real again instead, and
   reports both.

``--calibration-runs OUT.json`` measures, in one go, the grid and ``CALIBRATION_GRID`` (the same kinds of plan at
other global batches and micro-batches, so that compute, which grows with the tokens a rank works on, can be told
apart from what a step costs whatever its size) and writes them as the calibration records
``tests/trainer/planner/data/cpu_trials.json`` holds; trial mode is not run.

With fewer than four cores the 4-process plans run oversubscribed: the measured times are what the machine does,
not what four devices would, and the planner (one CPU "device" per process) does not know that — trial mode has to
find out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trainer.contract.presets import DEMO_TEXT, MODELS, local_cpu_cluster
from trainer.contract import DatasetSpec, ParallelPlan
from trainer.planner.estimate.calibrate import StepTerms
from trainer.planner.tune.measure import LocalTrials, TrialError, plan_label
from trainer.planner.tune.search import Candidate, rank_plans, trial_features
from trainer.planner.tune.space import SearchSpace
from trainer.planner.tune.trials import TrialResult, run_trials

GLOBAL_BATCH = 16
MAX_FRACTION = 1 / 3
TOLERANCE = 0.05
_NATIVE = dict(global_batch=GLOBAL_BATCH, precision="fp32", engine="native")

# (processes, plan fields): what the native trainer can run on a few CPU processes, one or two changes at a time.
GRID: tuple[dict, ...] = (
    dict(dp=2, micro_batch=4),
    dict(dp=2, micro_batch=4, zero_stage=3),
    dict(dp=2, micro_batch=2, activation_checkpointing="full"),
    dict(dp=2, micro_batch=4, activation_checkpointing="selective"),
    dict(tp=2, micro_batch=4),
    dict(tp=2, micro_batch=4, sequence_parallel=True),
    dict(pp=2, micro_batch=4, pipeline_schedule="1f1b"),
    dict(pp=2, micro_batch=4, pipeline_schedule="gpipe"),
    dict(pp=2, micro_batch=2, pipeline_schedule="interleaved", virtual_stages=2),
    dict(dp=4, micro_batch=4),
    dict(dp=4, micro_batch=4, zero_stage=3),
    dict(dp=2, tp=2, micro_batch=4, sequence_parallel=True),
    dict(dp=2, pp=2, micro_batch=4, pipeline_schedule="1f1b"),
    dict(tp=2, pp=2, micro_batch=4, pipeline_schedule="1f1b"),
    dict(pp=4, micro_batch=4, pipeline_schedule="1f1b"),
    dict(tp=4, micro_batch=4),
)


# More plans for calibration: the grid's kinds at 8 or 32 sequences a step and other micro-batches.
CALIBRATION_GRID: tuple[dict, ...] = (
    dict(dp=2, micro_batch=8, global_batch=32),
    dict(dp=2, micro_batch=2, global_batch=8),
    dict(dp=2, micro_batch=4, global_batch=32),
    dict(dp=2, micro_batch=4, global_batch=32, zero_stage=3),
    dict(pp=2, micro_batch=4, global_batch=32, pipeline_schedule="1f1b"),
    dict(pp=2, micro_batch=2, global_batch=8, pipeline_schedule="gpipe"),
    dict(tp=2, micro_batch=4, global_batch=8),
    dict(tp=2, micro_batch=8, global_batch=16),
    dict(dp=4, micro_batch=8, global_batch=32),
    dict(dp=4, micro_batch=2, global_batch=16),
    dict(dp=4, micro_batch=4, global_batch=32),
    dict(dp=4, micro_batch=2, global_batch=16, zero_stage=3),
    dict(pp=4, micro_batch=2, global_batch=16, pipeline_schedule="1f1b"),
    dict(dp=2, pp=2, micro_batch=4, global_batch=32, pipeline_schedule="1f1b"),
    dict(tp=2, pp=2, micro_batch=4, global_batch=8, pipeline_schedule="1f1b"),
    dict(dp=2, tp=2, micro_batch=4, global_batch=16),
)


def grid_plans() -> list[ParallelPlan]:
    return [ParallelPlan(**_NATIVE, **fields) for fields in GRID]


def calibration_plans() -> list[ParallelPlan]:
    """The grid and ``CALIBRATION_GRID``: the plans ``--calibration-runs`` measures."""
    extra = [ParallelPlan(**{**_NATIVE, **fields}) for fields in CALIBRATION_GRID]
    return grid_plans() + extra


def record_label(plan: ParallelPlan) -> str:
    """``plan_label``, with the global batch when it is not the grid's (labels stay unique in a records file)."""
    label = plan_label(plan)
    return label if plan.global_batch == GLOBAL_BATCH else f"{label}-g{plan.global_batch}"


def measure_calibration_runs(root: Path, steps: int = 20, warmup: int = 5,
                             progress: Callable[[str], None] = print) -> dict:
    """Every plan of ``calibration_plans()`` measured once, one after another: the calibration records."""
    model = MODELS["tiny"]
    dataset = DatasetSpec(path=str(DEMO_TEXT), prepared_dir=str(root / "data"))
    trials = LocalTrials(model, dataset, root / "calibration", steps=steps, warmup=warmup)
    started, load_before = time.perf_counter(), os.getloadavg()
    runs = []
    plans = calibration_plans()
    failed = []
    for i, plan in enumerate(plans, 1):
        for attempt in (1, 2):  # gloo on oversubscribed cores now and then loses a rank: one more try
            try:
                seconds = trials(plan)
                break
            except TrialError as exc:
                progress(f"  {i:2d}/{len(plans)} {record_label(plan):<40} attempt {attempt} failed: "
                         f"{str(exc).splitlines()[0][:200]}")
        else:
            failed.append(record_label(plan))
            continue
        runs.append({"label": record_label(plan), "plan": plan.to_dict(), "measured_step_time_s": seconds})
        progress(f"  {i:2d}/{len(plans)} {record_label(plan):<40} {seconds * 1e3:7.1f} ms/step")
    return {"source": f"python -m bench.trainer.planner.trials --calibration-runs on {os.cpu_count()} CPU "
                      f"cores, one plan after another in one go: the tiny preset, fp32, native engine; each run the "
                      f"median step time of {steps} steps after {warmup} warm-up steps, OMP_NUM_THREADS=1, cluster "
                      f"= presets.local_cpu_cluster(world size); load average before / after "
                      f"{load_before[0]:.2f} / {os.getloadavg()[0]:.2f}; "
                      f"{time.perf_counter() - started:.0f} s in all",
            "model": "tiny", "runs": runs, "failed": failed}


@dataclass
class EstimatedGrid:
    pool: list[Candidate]             # fastest estimate first
    features: list[StepTerms]      # the same plans' compute and communication seconds, for trial mode's refit


def estimated_grid(model, plans: list[ParallelPlan]) -> EstimatedGrid:
    """The grid's Candidates and trial features.

    Estimates come from the tuner's enumeration on each world size's cluster, so a plan the rules reject would be
    missing here and is reported rather than measured."""
    space = SearchSpace(precisions=("fp32",), engines=("native",), max_virtual_stages=4)
    by_plan: dict[ParallelPlan, tuple[Candidate, StepTerms]] = {}
    for world in sorted({p.world_size for p in plans}):
        clu = local_cpu_cluster(world)
        wanted = [c for c in rank_plans(model, clu, GLOBAL_BATCH, space).ranked if c.plan in set(plans)]
        for c, f in zip(wanted, trial_features(model, clu, None, [c.plan for c in wanted])):
            by_plan[c.plan] = (c, f)
    missing = [plan_label(p) for p in plans if p not in by_plan]
    if missing:
        raise ValueError(f"not valid (or do not fit) for the tuner: {missing}")
    order = sorted(plans, key=lambda p: by_plan[p][0].step_time_s)
    return EstimatedGrid([by_plan[p][0] for p in order], [by_plan[p][1] for p in order])


@dataclass
class BenchResult:
    pool: list[Candidate]                     # estimate order
    truth: dict[ParallelPlan, float]          # ground truth: every plan measured once
    trials: TrialResult
    asked: list[ParallelPlan]                 # what trial mode measured, in order
    remeasured: dict[ParallelPlan, float]     # with --remeasure: trial mode's own measurements
    seconds: float
    load: tuple[tuple[float, float, float], tuple[float, float, float]]

    @property
    def best_plan(self) -> ParallelPlan:
        return min(self.truth, key=self.truth.__getitem__)

    @property
    def ratio(self) -> float:
        """The pick's ground-truth step time over the best ground-truth step time."""
        return self.truth[self.trials.best.plan] / self.truth[self.best_plan]

    def to_dict(self) -> dict:
        return {"pool": [{**c.to_dict(), "label": plan_label(c.plan), "measured_step_time_s": self.truth[c.plan],
                          "trial_order": (self.asked.index(c.plan) + 1) if c.plan in self.asked else None,
                          "remeasured_step_time_s": self.remeasured.get(c.plan)} for c in self.pool],
                "picked": plan_label(self.trials.best.plan), "best": plan_label(self.best_plan),
                "ratio": self.ratio, "measured": len(self.asked), "fraction": len(self.asked) / len(self.pool),
                "stopped": self.trials.stopped, "note": self.trials.note, "seconds": self.seconds,
                "cpu_count": os.cpu_count(), "loadavg_before": self.load[0], "loadavg_after": self.load[1]}


def run(root: Path, steps: int = 20, warmup: int = 5, remeasure: bool = False,
        replay: dict[str, float] | None = None, progress: Callable[[str], None] = print) -> BenchResult:
    model = MODELS["tiny"]
    started, load_before = time.perf_counter(), os.getloadavg()
    grid = estimated_grid(model, grid_plans())
    pool = grid.pool
    dataset = DatasetSpec(path=str(DEMO_TEXT), prepared_dir=str(root / "data"))
    truth: dict[ParallelPlan, float] = {}
    if replay is not None:  # earlier ground truth, for looking at trial mode again without the minutes of runs
        truth = {c.plan: replay[plan_label(c.plan)] for c in pool}
    else:
        trials = LocalTrials(model, dataset, root / "truth", steps=steps, warmup=warmup)
        for i, c in enumerate(pool, 1):
            truth[c.plan] = trials(c.plan)
            progress(f"  ground truth {i:2d}/{len(pool)} {plan_label(c.plan):<36} "
                     f"{truth[c.plan] * 1e3:7.1f} ms/step (estimate {c.step_time_s * 1e3:6.1f})")
    asked: list[ParallelPlan] = []
    remeasured: dict[ParallelPlan, float] = {}
    again = LocalTrials(model, dataset, root / "trials", steps=steps, warmup=warmup) if remeasure else None

    def measure(plan: ParallelPlan) -> float:
        asked.append(plan)
        if again is not None:
            remeasured[plan] = again(plan)
            return remeasured[plan]
        return truth[plan]

    result = run_trials(pool, measure, MAX_FRACTION, TOLERANCE, features=grid.features)
    return BenchResult(pool, truth, result, asked, remeasured, time.perf_counter() - started,
                       (load_before, os.getloadavg()))


def report(out: BenchResult, steps: int, warmup: int) -> str:
    best = out.truth[out.best_plan]
    picked = out.trials.best.plan
    n = len(out.pool)
    cores = os.cpu_count() or 1
    lines = [f"tiny (4 layers, d_model 64), {GLOBAL_BATCH} × 64 tokens a step, fp32, native engine, gloo on "
             f"{cores} CPU cores; each trial {warmup} warm-up + {steps} timed steps, median"]
    if cores < 4:
        lines.append(f"4-process plans run oversubscribed here (4 ranks on {cores} cores): measured as they are, "
                     "which the planner's one-device-per-rank estimate does not know")
    lines += ["", f"{'#':>2}  {'plan':<36} {'procs':>5} {'estimate ms':>11} {'measured ms':>11} {'/best':>6}  trial"]
    for i, c in enumerate(out.pool, 1):
        t = out.truth[c.plan]
        order = (f"#{out.asked.index(c.plan) + 1}" if c.plan in out.asked else "")
        if c.plan in out.remeasured:
            order += f" (re-measured {out.remeasured[c.plan] * 1e3:.1f} ms)"
        mark = " <- picked" if c.plan == picked else ""
        mark += " <- best" if c.plan == out.best_plan else ""
        lines.append(f"{i:>2}  {plan_label(c.plan):<36} {c.plan.world_size:>5} {c.step_time_s * 1e3:>11.1f} "
                     f"{t * 1e3:>11.1f} {t / best:>6.2f}  {order}{mark}")
    how = "re-measured for real" if out.remeasured else "answered from the ground-truth measurements"
    lines += ["", f"trial mode measured {len(out.asked)} of {n} plans ({len(out.asked) / n:.0%}; budget "
                  f"{out.trials.budget} = ⌊{n}/3⌋), {how}; stopped by {out.trials.stopped}",
              f"picked {plan_label(picked)}: {out.truth[picked] * 1e3:.1f} ms; best of all measured "
              f"{plan_label(out.best_plan)}: {best * 1e3:.1f} ms; ratio {out.ratio:.3f} "
              f"({'within' if out.ratio <= 1 + TOLERANCE else 'NOT within'} {TOLERANCE:.0%})",
              f"planner's own pick (lowest estimate) {plan_label(out.pool[0].plan)}: "
              f"ratio {out.truth[out.pool[0].plan] / best:.3f}",
              f"load average before / after: {out.load[0][0]:.2f} / {out.load[1][0]:.2f}; "
              f"{out.seconds:.0f} s in all"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer.planner.trials",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="", help="where the trial folders go (default: a new temporary folder)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per trial")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--remeasure", action="store_true", help="trial mode measures for real again")
    parser.add_argument("--json", default="", help="write the whole result here")
    parser.add_argument("--replay", default="", help="a --json file (or the committed cpu_trials.json): reuse its "
                                                      "ground truth, run trial mode only")
    parser.add_argument("--calibration-runs", default="", metavar="OUT.json",
                        help="measure the grid and CALIBRATION_GRID and write them as calibration records; no trials")
    args = parser.parse_args(argv)
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="bench-trials-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.calibration_runs:
        print(f"calibration runs under {root}", flush=True)
        records = measure_calibration_runs(root, args.steps, args.warmup, lambda s: print(s, flush=True))
        Path(args.calibration_runs).write_text(json.dumps(records, indent=1) + "\n")
        print(records["source"])
        return 0
    replay = None
    if args.replay:
        data = json.loads(Path(args.replay).read_text())
        # a --json file lists its "pool"; tests/trainer/planner/data/cpu_trials.json its "runs"
        # (the records file also holds runs at other global batches, under labels of their own)
        replay = {row["label"]: row["measured_step_time_s"] for row in data.get("pool") or data["runs"]}
    print(f"trial folders under {root}", flush=True)
    out = run(root, args.steps, args.warmup, args.remeasure, replay, progress=lambda s: print(s, flush=True))
    print()
    print(report(out, args.steps, args.warmup))
    if args.json:
        Path(args.json).write_text(json.dumps(out.to_dict(), indent=2))
    return 0 if out.ratio <= 1 + TOLERANCE and len(out.asked) <= len(out.pool) // 3 else 1


if __name__ == "__main__":
    sys.exit(main())
