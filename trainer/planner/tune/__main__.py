"""python -m trainer.planner.tune --model gpt3-175b --nodes 128 --global-batch 1536 [--top 10] [--json]

Prints the fastest plans, why the others were rejected (counts) and the memory/time Pareto front.
"""
from __future__ import annotations

import argparse
import json
import sys

from trainer.planner.estimate.__main__ import add_model_cluster_args, model_cluster_options
from trainer.planner.estimate.render import table
from trainer.contract import SpecError
from trainer.planner.tune.search import tune
from trainer.planner.tune.space import SearchSpace


def _plan_cells(c) -> tuple:
    p = c.plan
    return (f"{p.dp}×{p.tp}×{p.pp}", str(p.micro_batch), str(p.grad_accum), "sp" if p.sequence_parallel else "",
            f"{p.engine}/z{p.zero_stage}" + ("+off" if p.offload_optimizer or p.offload_params else ""),
            p.activation_checkpointing, p.precision,
            (p.pipeline_schedule + (f"/v{p.virtual_stages}" if p.virtual_stages > 1 else "")) if p.pp > 1 else "",
            f"{c.step_time_s:.3f}", f"{c.peak_memory_bytes / 1e9:.1f}", f"{c.mfu:.1%}", f"{c.tokens_per_s:,.0f}")


def _grid(cands, title: str) -> str:
    head = ("dp×tp×pp", "b", "m", "sp", "engine", "ckpt", "prec", "schedule", "step s", "GB", "MFU", "tokens/s")
    rows = [head] + [_plan_cells(c) for c in cands]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [title, "-" * len(title)] + ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.planner.tune", description=__doc__.splitlines()[0])
    add_model_cluster_args(parser)
    parser.add_argument("--global-batch", required=True, help="sequences per step; a comma list searches several")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--precisions", default="bf16")
    parser.add_argument("--engines", default="native,deepspeed")
    parser.add_argument("--no-offload", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        model, clu, options = model_cluster_options(args)
        try:
            batches = [int(b) for b in args.global_batch.split(",")]
        except ValueError:
            raise SpecError.single("global_batch", f"--global-batch={args.global_batch!r} must be integers") from None
        space = SearchSpace(precisions=tuple(args.precisions.split(",")), engines=tuple(args.engines.split(",")),
                            offload=not args.no_offload).validate()
        result = tune(model, clu, batches[0] if len(batches) == 1 else batches, space, options, top_k=args.top)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"{model.name or 'model'} on {clu.name}: {result.evaluated:,} valid plans estimated in "
          f"{result.elapsed_s:.2f} s; {result.fitting:,} fit in {clu.gpu.memory_gb:g} GB")
    print()
    print(_grid(result.ranked[:args.top], f"Fastest {min(args.top, len(result.ranked))} plans"))
    print()
    print(table([(reason, f"{n:,}", "") for reason, n in sorted(result.rejected.items(), key=lambda kv: -kv[1])],
                "Rejected (reason: count)"))
    print()
    print(_grid(result.pareto, "Pareto front (no plan is both faster and lighter)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
