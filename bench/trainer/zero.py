"""Section 4 of ``python -m bench.trainer``: ZeRO stages 0–3 side by side on the same model at dp=2, DeepSpeed
engine, with the native engine's DDP (its ZeRO-0) and FSDP2 (its ZeRO-3) beside them; median step time and
the model-state bytes each rank holds (against docs/formulas.md's 16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d for
mixed precision; in fp32 the weights are fp32 too, so stage 1 keeps 4Ψ weights + 4Ψ grads + 8Ψ/N_d moments)."""
from __future__ import annotations

import statistics
from pathlib import Path

from bench.trainer.common import bench_spec, launch
from trainer.contract import DatasetSpec
from trainer.contract.records import step_times
from trainer.contract.runfolder import METRICS, read_jsonl

ROWS = (("deepspeed", 0), ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3), ("native", 0), ("native", 3))


def zero_step_times(out: Path, dataset: DatasetSpec, steps: int) -> list[dict]:
    """Every row in one launch of two ranks; each row's median step after two warm-up steps, and its bytes."""
    jobs, names = [], {}
    for engine, stage in ROWS:
        name = f"zero-{engine}-{stage}"
        spec = bench_spec(out, name, dataset, steps, engine=engine, zero_stage=stage, dp=2, micro_batch=4,
                          global_batch=8)
        names[(engine, stage)] = Path(spec.output_dir)
        jobs.append({"spec": spec.to_dict(), "run_dir": spec.output_dir})
    launch(2, jobs, out)
    rows = []
    for (engine, stage), run_dir in names.items():
        records = [r for _, r in read_jsonl(run_dir / METRICS)]
        memory = records[0]["memory"]
        rows.append({"engine": engine, "zero_stage": stage,
                     "median_ms": statistics.median(step_times(records, after_step=2)) * 1e3,
                     **{k: memory[k] for k in ("params_bytes", "grads_bytes", "optimizer_bytes")}})
    return rows


def print_zero_rows(rows: list[dict]) -> None:
    print("4. ZeRO stages side by side, dp=2, batch 8 × seq 128, fp32 (median step; model-state bytes on rank 0)")
    print("   engine     stage   step ms    params MiB   grads MiB   optimizer MiB")
    for r in rows:
        print(f"   {r['engine']:9s}  {r['zero_stage']:5d}  {r['median_ms']:8.1f}    {r['params_bytes'] / 2**20:9.2f}"
              f"   {r['grads_bytes'] / 2**20:9.2f}   {r['optimizer_bytes'] / 2**20:13.2f}")
    print()
