"""Section 2 of ``python -m trainer.bench``: the measured idle fraction of each pipeline stage (torch.profiler,
digested by trainer.profiling.digest) for p=2 and m=2, 4, 8 micro-batches, against (p−1)/(m+p−1); and the
interleaved schedule (v=2) against (p−1)/(v·m+p−1). A one-process run of the same micro-batches gives the host
overhead every step has anyway; "corrected" = 1 − compute share(pipeline) / compute share(one process)."""
from __future__ import annotations

from pathlib import Path

import torch

from trainer.bench.common import bench_spec, fresh, launch
from trainer.contract import DatasetSpec, ProfileSpec, RunSpec
from trainer.contract.runfolder import PROFILES, read_json
from trainer.engine.loop import run

MICROBATCHES = (2, 4, 8)


def _specs(out: Path, dataset: DatasetSpec, steps: int, micro_batch: int) -> dict[tuple[str, int], RunSpec]:
    profile = ProfileSpec(start_step=3, steps=3, warmup=1, name="bubble")
    specs = {}
    for m in MICROBATCHES:
        common = dict(profile=profile, micro_batch=micro_batch, global_batch=m * micro_batch)
        specs[("pp2", m)] = bench_spec(out, f"bubble-pp2-m{m}", dataset, steps, pp=2, pipeline_schedule="1f1b",
                                       **common)
        specs[("pp1", m)] = bench_spec(out, f"bubble-pp1-m{m}", dataset, steps, pp=1, **common)
        if m >= 2 * 2:  # interleaved 1F1B, v=2 chunks of one block each per rank (needs m ≥ p; 4 and 8 shown)
            specs[("pp2v2", m)] = bench_spec(out, f"bubble-pp2v2-m{m}", dataset, steps, pp=2,
                                             pipeline_schedule="interleaved", virtual_stages=2, **common)
    return specs


def _compute_share(run_dir: Path) -> list[float]:
    summary = read_json(run_dir / PROFILES / "bubble" / "summary.json")
    return [r["shares"]["compute"] for r in sorted(summary["ranks"], key=lambda r: r["rank"])]


def pipeline_bubble(out: Path, dataset: DatasetSpec, steps: int, micro_batch: int) -> list[dict]:
    specs = _specs(out, dataset, steps, micro_batch)
    for s in specs.values():
        fresh(Path(s.output_dir))
    launch(2, [{"spec": s.to_dict(), "run_dir": s.output_dir} for (kind, _), s in specs.items() if kind != "pp1"],
           out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each pipeline rank (OMP_NUM_THREADS=1), so that host overhead compares
    try:
        for (kind, _), s in specs.items():
            if kind == "pp1":
                run(s, Path(s.output_dir), resume=False)
    finally:
        torch.set_num_threads(threads)
    rows, p = [], 2
    for kind, m in specs:
        if kind == "pp1":
            continue
        v = 2 if kind == "pp2v2" else 1
        piped = _compute_share(Path(specs[(kind, m)].output_dir))
        alone = _compute_share(Path(specs[("pp1", m)].output_dir))[0]
        corrected = [1 - c / alone for c in piped]
        # bubble (p−1)/(v·m) of the ideal time is (p−1)/(v·m + p−1) of the whole step
        rows.append({"m": m, "v": v, "theory": (p - 1) / (v * m + p - 1), "measured_per_stage": [1 - c for c in piped],
                     "corrected_per_stage": corrected, "corrected_mean": sum(corrected) / len(corrected),
                     "host_overhead_one_process": 1 - alone})
    return sorted(rows, key=lambda r: (r["v"], r["m"]))
