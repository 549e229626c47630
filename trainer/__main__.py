"""python -m trainer --spec spec.json [--resume]: one process per rank under torchrun or srun (or alone).

Exit status: 0 finished or stopped (SIGTERM: the current step finishes and a checkpoint is saved), 2 the spec or
plan cannot run (nothing was done), 1 the run failed (the traceback is in events.jsonl and logs/rank-<r>.log).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from trainer.contract import RunSpec, SpecError
from trainer.contract.records import Event, event
from trainer.contract.runfolder import EVENTS, append_jsonl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="the run's spec.json")
    parser.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    parser.add_argument("--until-step", type=int, default=0,
                        help="stop after this step with a checkpoint, as on SIGTERM (0: run all steps)")
    parser.add_argument("--output-dir", default="", help="run folder (default: the spec's output_dir)")
    args = parser.parse_args(argv)

    try:
        text = Path(args.spec).read_text()
        spec = RunSpec.from_json(text)  # the contract's checks, engine refusals included: the only ones
    except (OSError, SpecError) as exc:
        return _refuse([str(exc)], _output_dir_of(args, locals().get("text")))
    # torch and the training program load only for a run that will happen: a refusal answers in a fraction of that
    import torch.distributed as dist

    from trainer.engine.loop import run

    run(spec, Path(args.output_dir or spec.output_dir), resume=args.resume, stop_at=args.until_step)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _refuse(reasons: list[str], run_dir: Path | None) -> int:
    for reason in reasons:
        print(f"error: {reason}", file=sys.stderr)
    if run_dir is not None and os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
        # The run folder is how the web app learns why: one event, nothing else written.
        append_jsonl(run_dir / EVENTS, event(Event.FAILED, 0, error="; ".join(reasons), refused=True))
    return 2


def _output_dir_of(args, text: str | None) -> Path | None:
    """The run folder of a spec that does not validate, if its JSON says where."""
    if args.output_dir:
        return Path(args.output_dir)
    try:
        folder = json.loads(text or "").get("output_dir")
    except (ValueError, AttributeError):
        return None
    return Path(folder) if isinstance(folder, str) and folder else None


if __name__ == "__main__":
    sys.exit(main())
