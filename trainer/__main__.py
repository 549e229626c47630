"""python -m trainer --spec spec.json [--resume | --restart]: one process per rank under torchrun or srun (or alone).

Exit status: 0 finished or stopped (SIGTERM: the current step finishes and a checkpoint is saved), 2 the spec, the
plan, the process count or the run folder does not allow the run (nothing was built; one line says why), 1 the run
failed (the traceback is in events.jsonl and logs/rank-<r>.log).

A spec without a cluster runs on this machine's CPU ranks: the cluster is filled in from the plan's world size.
A run folder that holds an earlier run's output needs ``--resume`` (continue from its newest checkpoint, the records
of redone steps superseding the old ones) or ``--restart`` (start over: its events, metrics, checkpoints and
profiles are removed first).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from trainer.contract import ParallelPlan, RunSpec, SpecError
from trainer.contract.manifest import init_from_problem
from trainer.contract.presets import local_cpu_cluster
from trainer.contract.records import Event, event
from trainer.contract.runfolder import EVENTS, append_jsonl, clear_outputs, used


class Refusal(Exception):
    """The run cannot start; ``record`` says whether the run folder should hear of it (a folder that belongs to
    another run must not)."""

    def __init__(self, reason: str, run_dir: Path | None, record: bool = True):
        super().__init__(reason)
        self.run_dir, self.record = run_dir, record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="the run's spec.json")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    again.add_argument("--restart", action="store_true", help="start over in a run folder an earlier run wrote")
    parser.add_argument("--until-step", type=int, default=0,
                        help="stop after this step with a checkpoint, as on SIGTERM (0: run all steps)")
    parser.add_argument("--output-dir", default="", help="run folder (default: the spec's output_dir)")
    args = parser.parse_args(argv)
    try:
        spec, run_dir = _checked(args)
    except Refusal as refusal:
        return _refuse(refusal)
    # torch and the training program load only for a run that will happen: a refusal answers in a fraction of that
    import torch.distributed as dist

    from trainer.engine.loop import run

    run(spec, run_dir, resume=args.resume, stop_at=args.until_step)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _checked(args) -> tuple[RunSpec, Path]:
    """The spec and the run folder, or the one reason the run cannot start, before anything is built."""
    try:
        data = json.loads(Path(args.spec).read_text())
    except (OSError, ValueError) as exc:
        raise Refusal(f"cannot read the spec {args.spec}: {exc}", Path(args.output_dir) if args.output_dir else None)
    run_dir = Path(args.output_dir) if args.output_dir else _output_dir_of(data)
    try:
        spec = RunSpec.from_dict(_with_local_cluster(data))  # the contract's checks: the only ones
    except SpecError as exc:
        raise Refusal(str(exc), run_dir) from None
    run_dir = run_dir or Path(spec.output_dir)
    ranks = _launched_ranks()
    if ranks is not None and ranks != spec.plan.world_size:
        p = spec.plan
        raise Refusal(f"the plan needs dp×tp×pp={p.dp}×{p.tp}×{p.pp}={p.world_size} processes but this job started "
                      f"{ranks}: launch with --nproc_per_node={p.world_size} (or as many tasks)", run_dir)
    if not (args.resume or args.restart) and used(run_dir):
        raise Refusal(f"{run_dir} holds an earlier run's output: pass --resume to continue it or --restart to start "
                      f"over", run_dir, record=False)
    if spec.init_from is not None and not args.resume:  # resuming, the run's own checkpoint is read instead
        problem = init_from_problem(spec.init_from.checkpoint, spec.model)
        if problem:
            raise Refusal(problem, run_dir)
    if args.restart and _rank() == 0:
        clear_outputs(run_dir)  # before any process group: no other rank has written anything yet
    return spec, run_dir


def _with_local_cluster(data: Any) -> Any:
    """A spec without a cluster describes this machine: as many CPU ranks as the plan has processes."""
    if not isinstance(data, dict) or "cluster" in data:
        return data
    try:
        plan = ParallelPlan.from_dict(data.get("plan", {}), validate=False)
    except SpecError:
        return data  # the plan's own errors are reported by the whole spec's validation
    return {**data, "cluster": local_cpu_cluster(max(plan.world_size, 1)).to_dict()}


def _launched_ranks() -> int | None:
    """How many processes the launcher started (torchrun's WORLD_SIZE, srun's SLURM_NTASKS); None when alone."""
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _rank() -> int:
    value = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    return int(value) if value.isdigit() else 0


def _refuse(refusal: Refusal) -> int:
    if _rank() != 0:
        return 2  # every rank refuses the same way; one of them says so
    print(f"error: {refusal}", file=sys.stderr)
    # Under torchrun the failure summary shows this file's message instead of a pointer to its documentation.
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        Path(error_file).write_text(json.dumps({"message": f"the run was refused: {refusal}",
                                                "timestamp": str(int(time.time()))}))
    if refusal.record and refusal.run_dir is not None:
        # The run folder is how the web app learns why: one event, nothing else written.
        append_jsonl(refusal.run_dir / EVENTS, event(Event.FAILED, 0, error=str(refusal), refused=True))
    return 2


def _output_dir_of(data: Any) -> Path | None:
    """The run folder a spec names, even when the spec does not validate."""
    folder = data.get("output_dir") if isinstance(data, dict) else None
    return Path(folder) if isinstance(folder, str) and folder else None


if __name__ == "__main__":
    sys.exit(main())
