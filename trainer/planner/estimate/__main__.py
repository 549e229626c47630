"""python -m trainer.planner.estimate --model gpt3-175b --gpu A100-SXM-80GB --nodes 128 --dp 8 --tp 8 --pp 16 ...

Prints the estimate as tables with formulas, or JSON with --json. The model is a preset name or --model-json FILE;
the plan comes from the flags or --plan-json FILE (flags given explicitly override the file's fields).
"""
from __future__ import annotations

import argparse
import json
import sys

from trainer.planner.estimate.explain import estimate
from trainer.planner.estimate.inference import inference_estimate
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.render import figure_rows, render_estimate, table
from trainer.contract.presets import GPUS, MODELS, cluster
from trainer.contract import ClusterSpec, ModelSpec, ParallelPlan, SpecError

PLAN_FLAGS = {"dp": int, "tp": int, "pp": int, "micro_batch": int, "global_batch": int, "ep": int,
              "zero_stage": int, "virtual_stages": int, "engine": str, "activation_checkpointing": str,
              "precision": str, "pipeline_schedule": str}


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError.single(path, f"cannot read JSON: {exc}") from None


def add_model_cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help=f"preset: {', '.join(MODELS)}")
    parser.add_argument("--model-json", help="a ModelSpec JSON file")
    parser.add_argument("--gpu", default="A100-SXM-80GB", help=f"preset: {', '.join(GPUS)}")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--inter-node-gbs", type=float, default=50.0, help="inter-node bandwidth per GPU, GB/s")
    parser.add_argument("--gpu-hour-cost", type=float, default=0.0)
    parser.add_argument("--cluster-json", help="a ClusterSpec JSON file (overrides --gpu/--nodes)")
    parser.add_argument("--options-json", help="EstimateOptions as JSON (e.g. from calibration)")


def model_cluster_options(args) -> tuple[ModelSpec, ClusterSpec, EstimateOptions]:
    if args.model_json:
        model = ModelSpec.from_dict(_read_json(args.model_json))
    elif args.model in MODELS:
        model = MODELS[args.model]
    else:
        raise SpecError.single("model", f"unknown model {args.model!r}; presets: {', '.join(MODELS)} "
                                        f"(or pass --model-json)")
    if args.cluster_json:
        clu = ClusterSpec.from_dict(_read_json(args.cluster_json))
    else:
        if args.gpu not in GPUS:
            raise SpecError.single("gpu", f"unknown GPU {args.gpu!r}; presets: {', '.join(GPUS)}")
        clu = cluster(args.gpu, args.nodes, args.gpus_per_node, inter_node_bandwidth_gbs=args.inter_node_gbs,
                      gpu_hour_cost=args.gpu_hour_cost).validate()
    options = EstimateOptions.from_dict(_read_json(args.options_json)) if args.options_json else EstimateOptions()
    return model, clu, options


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.planner.estimate", description=__doc__.splitlines()[0])
    add_model_cluster_args(parser)
    parser.add_argument("--plan-json", help="a ParallelPlan JSON file")
    for name, kind in PLAN_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    parser.add_argument("--sequence-parallel", action="store_true", default=None)
    parser.add_argument("--offload-optimizer", action="store_true", default=None)
    parser.add_argument("--offload-params", action="store_true", default=None)
    parser.add_argument("--tokens", type=float, help="token budget: time, GPU-hours and cost to train on it")
    parser.add_argument("--inference", action="store_true", help="also print serving memory and decode bound")
    parser.add_argument("--batch", type=int, default=1, help="inference batch")
    parser.add_argument("--context", type=int, help="inference context length (default: seq_len)")
    parser.add_argument("--depth", type=int, default=2, help="how deep to print the formula tree")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    args = parser.parse_args(argv)
    try:
        model, clu, options = model_cluster_options(args)
        fields = _read_json(args.plan_json) if args.plan_json else {}
        fields = {k: v for k, v in fields.items() if k != "schema_version"}
        for name in list(PLAN_FLAGS) + ["sequence_parallel", "offload_optimizer", "offload_params"]:
            value = getattr(args, name)
            if value is not None:
                fields[name] = value
        if "dp" not in fields:  # fill dp from the cluster when not given
            fields["dp"] = max(1, clu.world_size // (fields.get("tp", 1) * fields.get("pp", 1)))
        plan = ParallelPlan.from_dict(fields)
        est = estimate(model, plan, clu, options, args.tokens)
        if args.json:
            print(json.dumps(est.to_dict(), indent=2))
        else:
            print(render_estimate(est, args.depth))
        if args.inference:
            inf = inference_estimate(model, clu, tp=plan.tp, batch=args.batch, context=args.context,
                                     precision="fp32" if plan.precision == "fp32" else "bf16")
            rows = [r for n, f in inf.figures.items() for r in figure_rows(n, f, 0)]
            print("\n" + table(rows, f"Inference (t={plan.tp}, batch={args.batch})"))
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
