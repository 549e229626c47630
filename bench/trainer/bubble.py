"""Section 2 of ``python -m bench.trainer``: the measured idle fraction of each pipeline stage (torch.profiler,
digested by trainer.profiling.digest) for p=2 and m=2, 4, 8 micro-batches, for 1F1B, interleaved 1F1B (v=2) and the
zero-bubble schedules (zb-interleaved, zbv, dualpipev), each against the planner's theory (the bubble b of
``memory.bubble_fraction`` is b/(1+b) of the step) and, for the zero-bubble ones, against 1F1B's measured figure at
the same m. A one-process run of the same micro-batches gives the host overhead every step has anyway;
"corrected" = 1 − compute share(pipeline) / compute share(one process)."""
from __future__ import annotations

from pathlib import Path

import torch

from bench.trainer.common import bench_spec, fresh, launch
from trainer.contract import DatasetSpec, ParallelPlan, ProfileSpec, RunSpec
from trainer.contract.runfolder import PROFILES, read_json
from trainer.engine.loop import run
from trainer.planner.estimate.memory import bubble_fraction

MICROBATCHES = (2, 4, 8)
P = 2
# (schedule, chunks per rank), each at the m the contract lets it run (the V-shaped ones need more than p)
SCHEDULES = (("1f1b", 1), ("interleaved", 2), ("zb-interleaved", 1), ("zbv", 2), ("dualpipev", 2))


def _specs(out: Path, dataset: DatasetSpec, steps: int, micro_batch: int) -> dict[tuple[str, int], RunSpec]:
    profile = ProfileSpec(start_step=3, steps=3, warmup=1, name="bubble")
    specs = {}
    for m in MICROBATCHES:
        specs[("pp1", m)] = bench_spec(out, f"bubble-pp1-m{m}", dataset, steps, pp=1, profile=profile,
                                       micro_batch=micro_batch, global_batch=m * micro_batch)
        for schedule, v in SCHEDULES:
            fields = dict(pp=P, pipeline_schedule=schedule, virtual_stages=v, micro_batch=micro_batch,
                          global_batch=m * micro_batch)
            if not ParallelPlan(**fields).problems():
                specs[(schedule, m)] = bench_spec(out, f"bubble-{schedule}-m{m}", dataset, steps, profile=profile,
                                                  **fields)
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
    rows = []
    for (kind, m), spec in specs.items():
        if kind == "pp1":
            continue
        piped = _compute_share(Path(spec.output_dir))
        alone = _compute_share(Path(specs[("pp1", m)].output_dir))[0]
        corrected = [1 - c / alone for c in piped]
        bubble = bubble_fraction(spec.plan)
        rows.append({"schedule": kind, "m": m, "v": spec.plan.model_chunks, "theory": bubble / (1 + bubble),
                     "measured_per_stage": [1 - c for c in piped], "corrected_per_stage": corrected,
                     "corrected_mean": sum(corrected) / len(corrected), "host_overhead_one_process": 1 - alone})
    one_f_one_b = {r["m"]: r["corrected_mean"] for r in rows if r["schedule"] == "1f1b"}
    for r in rows:
        r["against_1f1b"] = r["corrected_mean"] / one_f_one_b[r["m"]] if one_f_one_b.get(r["m"]) else None
    order = [name for name, _ in SCHEDULES]
    return sorted(rows, key=lambda r: (order.index(r["schedule"]), r["m"]))
