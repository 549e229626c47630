"""Run several training jobs one after another in one process group (a torchrun launch costs ~15 s here).

    torchrun --nproc_per_node=N tests/trainer/multirun.py jobs.json

jobs.json: a list of {"spec": <RunSpec dict>, "run_dir": str, "resume": bool, "stop_at": int}; every plan's
world size must be N.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainer.contract import RunSpec  # noqa: E402
from trainer.train import run  # noqa: E402


def main(path: str) -> int:
    import torch.distributed as dist

    for job in json.loads(Path(path).read_text()):
        spec = RunSpec.from_dict(job["spec"])
        run(spec, Path(job["run_dir"]), resume=job.get("resume", False), stop_at=job.get("stop_at", 0))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
