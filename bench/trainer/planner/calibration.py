"""Benchmark: held-out step-time error of the planner's calibrated time model on real CPU runs, before and after.

    python -m bench.trainer.planner.calibration [RECORDS.json]

RECORDS.json (default: tests/trainer/planner/data/cpu_trials.json, as ``python -m bench.trainer.planner.trials``
writes it) holds measured runs of one model on local CPU clusters. Each cluster is fitted twice: "before" with
the four-term model the planner had (x_c·C + x_n·N + α·K + x_0, one compute efficiency at the base GEMM shape),
"after" with the full time model, its terms chosen by leave-one-out on the cluster's runs
(trainer.planner.estimate.calibrate). Both are scored the same way: each run predicted by a fit that left it out,
|predicted − measured| / measured; the table gives the median and mean per cluster and over every run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.planner.estimate.calibrate import TODAY_TERMS, MeasuredRun, calibrate

DEFAULT_RECORDS = Path(__file__).resolve().parents[3] / "tests" / "trainer" / "planner" / "data" / "cpu_trials.json"


def load_runs(path: Path) -> list[MeasuredRun]:
    data = json.loads(path.read_text())
    runs = []
    for row in data["runs"]:
        plan = ParallelPlan.from_dict(row["plan"])
        runs.append(MeasuredRun(MODELS[data["model"]], plan, local_cpu_cluster(plan.world_size),
                                row["measured_step_time_s"]))
    return runs


def held_out_errors(runs: list[MeasuredRun], terms) -> dict[str, list[float]]:
    """Each cluster's leave-one-out relative errors, and "all" of them."""
    clusters = calibrate(runs, terms=terms).clusters
    out = {key: c.time_errors for key, c in sorted(clusters.items())}
    out["all"] = [e for errors in out.values() for e in errors]
    return out


def report(runs: list[MeasuredRun]) -> str:
    started = time.perf_counter()
    before, after = held_out_errors(runs, TODAY_TERMS), held_out_errors(runs, None)
    seconds = time.perf_counter() - started
    chosen = calibrate(runs).clusters
    lines = [f"{'cluster':<14} {'runs':>4}  {'median before':>13} {'median after':>12}  {'mean before':>11} "
             f"{'mean after':>10}  terms after"]
    for key in before:
        b, a = before[key], after[key]
        terms = "" if key == "all" else ", ".join(chosen[key].time_terms)
        lines.append(f"{key:<14} {len(a):>4}  {median(b):>12.1%} {median(a):>12.1%}  {sum(b) / len(b):>11.1%} "
                     f"{sum(a) / len(a):>10.1%}  {terms}")
    lines.append(f"(both fits, every leave-one-out, in {seconds:.1f} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer.planner.calibration",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="?", default=str(DEFAULT_RECORDS), help="measured runs (JSON)")
    args = parser.parse_args(argv)
    print(report(load_runs(Path(args.records))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
