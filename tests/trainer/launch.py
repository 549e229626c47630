"""Helpers for the trainer's tests: tiny specs, real torchrun launches on gloo, reading run folders."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from trainer.contract.command import trainer_command
from trainer.contract.presets import MODELS, local_cpu_cluster
from trainer.contract import DatasetSpec, OptimizerSpec, ParallelPlan, RunSpec

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
JOBS = ("-m", "trainer.engine.jobs")  # several jobs one after another in one launch
_PLAN_FIELDS = set(ParallelPlan.__dataclass_fields__)


def tiny_spec(run_dir: Path, dataset: DatasetSpec, steps: int = 20, tied: bool = True, layers: int = 4,
              model=None, cluster=None, **kw) -> RunSpec:
    """The "tiny" preset (4 layers, d_model 64) on 8 sequences of 64 tokens a step, fp32, on local CPU ranks unless
    ``cluster`` is given; ``kw`` sets plan fields (dp, tp, pp, micro_batch, …) or run fields (checkpoint_every, …)."""
    model = model or MODELS["tiny"].replace(tied_embeddings=tied, n_layers=layers)
    plan_kw = {"micro_batch": 2, "global_batch": 8, **{k: v for k, v in kw.items() if k in _PLAN_FIELDS}}
    run_kw = {k: v for k, v in kw.items() if k not in _PLAN_FIELDS}
    plan = ParallelPlan(**plan_kw)
    run_kw.setdefault("optimizer", OptimizerSpec(lr=1e-3, min_lr=1e-4, warmup_steps=2))
    return RunSpec(model=model, plan=plan, cluster=cluster or local_cpu_cluster(plan.world_size), dataset=dataset,
                   output_dir=str(run_dir), steps=steps, **run_kw).validate()


# Tensor parallel is what makes the parity launches slow (gloo on shared cores, DTensor's dispatch: a tp2 step costs
# ~10 dp2 steps), so its plans stop after their first steps, the learning rate still scheduled over all of them, and
# are compared with the reference's first steps.
TP_PARITY_STEPS = 8


def parity_stop(plan: dict) -> int:
    """The step a parity plan of these plan fields stops at (0: it runs all its steps)."""
    return TP_PARITY_STEPS if plan.get("tp", 1) > 1 else 0


def job(spec: RunSpec, resume: bool = False, stop_at: int = 0) -> dict:
    """What ``launch`` runs of ``spec``, in its output folder: ``resume`` from its newest checkpoint; ``stop_at``: stop
    (saved) after that many steps, the learning rate still scheduled over all of ``spec.steps``."""
    return {"spec": spec, "run_dir": spec.output_dir, "resume": resume, "stop_at": stop_at}


def model_jobs(runs: Path, dataset: DatasetSpec, plans: dict, steps: int, stop_at: int = 0) -> list[dict]:
    """One job a named (model, plan fields) pair, each run in its own folder under ``runs``: what a parity test
    launches, then compares with the same model's run on one process."""
    return [job(tiny_spec(runs / name, dataset, steps, model=model, **kw), stop_at=stop_at)
            for name, (model, kw) in plans.items()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def launch(nproc: int, jobs: list[dict], workdir: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``jobs`` (dicts of spec, run_dir, resume, stop_at) one after another in one launch of ``nproc``
    processes: torchrun for several, a plain process for one (a world of one needs no launcher)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"jobs-{nproc}-{len(list(workdir.iterdir()))}.json"
    path.write_text(json.dumps([{**j, "spec": j["spec"].to_dict(), "run_dir": str(j["run_dir"])} for j in jobs]))
    cmd = trainer_command([str(path)], nproc_per_node=nproc, endpoint=f"127.0.0.1:{free_port()}",
                          launcher_for_one=False, program=JOBS, python=PYTHON)
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n"
                             f"{done.stderr[-6000:]}")
    return done


def records(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    path = Path(run_dir) / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in records(run_dir) if "loss" in r]


def max_rel_error(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a, f"{len(a)} vs {len(b)} steps"
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))
