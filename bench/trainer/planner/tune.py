"""Benchmark: how fast the auto-tuner enumerates, estimates and ranks plans for GPT-3 175B on 1,024 A100s.

    python -m bench.trainer.planner.tune [--nodes 128] [--batches 512,1024,1536,2048,3072]

The space: every valid (dp, tp, pp, micro-batch, sequence parallel, engine/ZeRO/offload, checkpointing, schedule,
virtual stages) for each global batch and each precision (bf16, fp16, fp32), micro-batches and virtual stages up to
the model's limits. Prints the number of plans estimated, how many fit, and the wall time beside the target: the whole
space (over 100,000 plans) ranked within 10 seconds on one core.
"""
from __future__ import annotations

import argparse
import time

from trainer.contract.presets import MODELS, cluster
from trainer.planner.tune.search import rank_plans
from trainer.planner.tune.space import SearchSpace

BENCH_SPACE = SearchSpace(precisions=("bf16", "fp16", "fp32"), max_micro_batch=1 << 30, max_virtual_stages=48)
BENCH_BATCHES = (512, 768, 1024, 1536, 2048, 3072, 4096)
TARGET_S = 10.0  # for the whole space of BENCH_BATCHES


def run(model: str = "gpt3-175b", gpu: str = "A100-SXM-80GB", nodes: int = 128,
        batches: tuple[int, ...] = BENCH_BATCHES) -> dict:
    spec, clu = MODELS[model], cluster(gpu, nodes)
    started, cpu_started = time.perf_counter(), time.process_time()
    ranking = rank_plans(spec, clu, batches, BENCH_SPACE)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    ranked, evaluated = ranking.ranked, ranking.evaluated
    return {"model": model, "gpus": clu.world_size, "global_batches": list(batches), "evaluated": evaluated,
            "fitting": len(ranked), "rejected": ranking.rejected, "seconds": elapsed, "cpu_seconds": cpu,
            "plans_per_second": evaluated / elapsed if elapsed else float("inf"),
            "best": ranked[0] if ranked else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer.planner.tune", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt3-175b")
    parser.add_argument("--gpu", default="A100-SXM-80GB")
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--batches", default=",".join(map(str, BENCH_BATCHES)))
    args = parser.parse_args(argv)
    out = run(args.model, args.gpu, args.nodes, tuple(int(b) for b in args.batches.split(",")))
    print(f"{out['model']} on {out['gpus']} GPUs, global batches {out['global_batches']}: "
          f"{out['evaluated']:,} plans estimated and ranked in {out['seconds']:.2f} s "
          f"(CPU {out['cpu_seconds']:.2f} s) "
          f"({out['plans_per_second']:,.0f} plans/s); {out['fitting']:,} fit in memory")
    if out["global_batches"] == list(BENCH_BATCHES):
        print(f"target: within {TARGET_S:.0f} s; took {out['seconds'] / TARGET_S:.2f} of it")
    best = out["best"]
    if best:
        p = best.plan
        print(f"fastest per token: dp={p.dp} tp={p.tp} pp={p.pp} b={p.micro_batch} B={p.global_batch} "
              f"sp={p.sequence_parallel} {p.engine}/zero{p.zero_stage} ckpt={p.activation_checkpointing} "
              f"{p.precision} {p.pipeline_schedule} v={p.virtual_stages}: {best.step_time_s:.2f} s/step, "
              f"MFU {best.mfu:.1%}, {best.peak_memory_bytes / 1e9:.1f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
