"""python -m trainer.engine.jobs jobs.json: several training jobs one after another in one process group.

A launch of several processes costs seconds of start-up (importing torch, joining the group, building DDP), so the
benchmarks and the tests run their many short jobs through one launch. jobs.json is a list of {"spec": <RunSpec
dict>, "run_dir": str, "resume": bool, "stop_at": int}; every plan's world size must be the launch's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from trainer.contract import RunSpec
from trainer.engine.loop import run


def run_jobs(path: str | Path) -> None:
    for job in json.loads(Path(path).read_text()):
        run(RunSpec.from_dict(job["spec"]), Path(job["run_dir"]), resume=job.get("resume", False),
            stop_at=job.get("stop_at", 0))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainer.engine.jobs JOBS.json", file=sys.stderr)
        return 2
    run_jobs(argv[0])
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
