"""The committed real CPU runs (data/cpu_trials.json, measured by
``python -m trainer.planner.tune.bench_trials --calibration-runs``) as calibration records."""
import json
from pathlib import Path

from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.planner.estimate import MeasuredRun

DATA = Path(__file__).parent / "data" / "cpu_trials.json"


def cpu_runs(world_size: int | None = None) -> list[MeasuredRun]:
    """Every committed run, or those of one world size (one cluster: ``local cpu x<world_size>``)."""
    data = json.loads(DATA.read_text())
    runs = []
    for r in data["runs"]:
        plan = ParallelPlan.from_dict(r["plan"])
        if world_size in (None, plan.world_size):
            runs.append(MeasuredRun(MODELS[data["model"]], plan, local_cpu_cluster(plan.world_size),
                                    r["measured_step_time_s"]))
    return runs
