"""The committed real CPU runs as calibration records: data/cpu_trials.json (the trial-mode grid, 16 plans) and
data/cpu_calibration_runs.json (that grid and 16 more plans at other batch sizes, 32 runs, measured in one go by
``python -m bench.trainer.planner.trials --calibration-runs``)."""
import json
from pathlib import Path

from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.planner.estimate import MeasuredRun

DATA = Path(__file__).parent / "data" / "cpu_trials.json"
CALIBRATION_DATA = Path(__file__).parent / "data" / "cpu_calibration_runs.json"


def cpu_runs(world_size: int | None = None, path: Path = DATA) -> list[MeasuredRun]:
    """Every run of ``path``, or those of one world size (one cluster: ``local cpu x<world_size>``)."""
    data = json.loads(path.read_text())
    runs = []
    for r in data["runs"]:
        plan = ParallelPlan.from_dict(r["plan"])
        if world_size in (None, plan.world_size):
            runs.append(MeasuredRun(MODELS[data["model"]], plan, local_cpu_cluster(plan.world_size),
                                    r["measured_step_time_s"]))
    return runs
