"""What the benchmark sections share: the model they time, its run specs, reading step times, one launch of jobs."""
from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
from pathlib import Path

from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, ProfileSpec, RunSpec
from trainer.contract.command import trainer_command
from trainer.contract.presets import demo_text, local_cpu_cluster
from trainer.contract.records import last_step_rows, step_times
from trainer.contract.runfolder import METRICS, read_jsonl

REPO = Path(__file__).resolve().parents[2]


def bench_model(layers: int = 4, d_model: int = 256, seq_len: int = 128) -> ModelSpec:
    return ModelSpec(name="bench", n_layers=layers, d_model=d_model, n_heads=4, seq_len=seq_len, vocab_size=512,
                     tied_embeddings=False)


def bench_spec(out: Path, name: str, dataset: DatasetSpec, steps: int, profile: ProfileSpec | None = None,
               **plan) -> RunSpec:
    plan_obj = ParallelPlan(**plan)
    return RunSpec(model=bench_model(), plan=plan_obj, cluster=local_cpu_cluster(plan_obj.world_size),
                   dataset=dataset, output_dir=str(out / name), steps=steps, profile=profile,
                   optimizer=OptimizerSpec(lr=3e-4, warmup_steps=2)).validate()


def median_step(run_dir: Path, skip: int = 2) -> float:
    """The median step time after the first ``skip`` steps (allocator growth, the memory probe, connections)."""
    return statistics.median(step_times([r for _, r in read_jsonl(Path(run_dir) / METRICS)], after_step=skip))


def median_row_interval(run_dir: Path, skip: int = 2) -> float:
    """The median time from one step's metrics row to the next, after the first ``skip`` steps: the loop's whole
    round, its bookkeeping included."""
    rows = last_step_rows([r for _, r in read_jsonl(Path(run_dir) / METRICS)])
    return statistics.median(b["time"] - a["time"] for a, b in zip(rows, rows[1:]) if a["step"] >= skip)


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


def sample_text(out: Path) -> Path:
    """The first 300 kB of the demo corpus, the benchmarks' training text."""
    dst = out / "text.txt"
    if not dst.exists():
        dst.write_bytes(demo_text(300_000))
    return dst


def launch(nproc: int, jobs: list[dict], out: Path) -> None:
    """Run ``jobs`` (spec dicts and run folders) one after another in one torchrun launch of ``nproc`` ranks."""
    path = out / "bench-jobs.json"
    path.write_text(json.dumps(jobs))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = trainer_command([str(path)], nproc_per_node=nproc, endpoint=f"127.0.0.1:{port}",
                          program=("-m", "trainer.engine.jobs"), python=sys.executable)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
