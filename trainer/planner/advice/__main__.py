"""python -m trainer.planner.advice --model gpt2-small --cluster A100-SXM-80GB --gpus 8 [--dp 8 --micro-batch 8 ...]

Prints the suggestions as a table (step time, memory per GPU, MFU and tokens/s before → after, the gain) with each
one's reason and formula lines, or JSON with --json. Without plan flags the tuner's best plan is advised on.
"""
from __future__ import annotations

import argparse
import json
import sys

from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError
from trainer.contract.presets import GPUS, MODELS, cluster
from trainer.planner.advice.advise import advise
from trainer.planner.advice.render import render_advice
from trainer.planner.estimate.__main__ import PLAN_FLAGS, _read_json


def _cluster(args) -> ClusterSpec:
    if args.cluster_json:
        return ClusterSpec.from_dict(_read_json(args.cluster_json))
    if args.cluster not in GPUS:
        raise SpecError.single("cluster", f"unknown GPU {args.cluster!r}; presets: {', '.join(GPUS)}")
    per_node = min(args.gpus, args.gpus_per_node)
    if args.gpus < 1 or args.gpus % per_node:
        raise SpecError.single("gpus", f"--gpus {args.gpus} must be a positive multiple of --gpus-per-node "
                                       f"{args.gpus_per_node} (or at most one node)")
    return cluster(args.cluster, args.gpus // per_node, per_node).validate()


def _plan(args, clu: ClusterSpec) -> ParallelPlan | None:
    fields = _read_json(args.plan_json) if args.plan_json else {}
    fields = {k: v for k, v in fields.items() if k != "schema_version"}
    for name in PLAN_FLAGS:
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    if not fields:
        return None
    if "dp" not in fields:
        fields["dp"] = max(1, clu.world_size // (fields.get("tp", 1) * fields.get("pp", 1)))
    return ParallelPlan.from_dict(fields)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.planner.advice", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-small", help=f"preset: {', '.join(MODELS)}")
    parser.add_argument("--model-json", help="a ModelSpec JSON file")
    parser.add_argument("--cluster", default="A100-SXM-80GB", help=f"a GPU preset: {', '.join(GPUS)}")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs in all")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--cluster-json", help="a ClusterSpec JSON file (overrides --cluster/--gpus)")
    parser.add_argument("--plan-json", help="a ParallelPlan JSON file")
    for name, kind in PLAN_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    parser.add_argument("--json", action="store_true", help="print the advice as JSON")
    args = parser.parse_args(argv)
    try:
        if args.model_json:
            model = ModelSpec.from_dict(_read_json(args.model_json))
        elif args.model in MODELS:
            model = MODELS[args.model]
        else:
            raise SpecError.single("model", f"unknown model {args.model!r}; presets: {', '.join(MODELS)}")
        clu = _cluster(args)
        plan = _plan(args, clu)
        advice = advise(model, clu, plan, global_batch=args.global_batch if plan is None else None)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(advice.to_dict(), indent=2) if args.json else render_advice(advice))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
