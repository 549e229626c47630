"""The one builder of a trainer command line: every launcher, trial, benchmark and test starts ranks through it.

    trainer_command(["--spec", "run/spec.json"], nproc_per_node=2)
      → python -m torch.distributed.run --standalone --nproc_per_node=2 -m trainer --spec run/spec.json

Forms (docs/operations.md, torchrun and Slurm):
- one node, no endpoint: torchrun ``--standalone`` (it picks a free port, so concurrent jobs never collide);
- one node with an endpoint ``host:port``: torchrun with that master address and port;
- several nodes: torchrun with c10d rendezvous at the endpoint (the first node), one torchrun per node;
  ``srun=True`` puts ``srun --nodes=N --ntasks-per-node=1`` in front, so Slurm starts that torchrun on every node;
- ``endpoint="env"``: the same without ``--rdzv_endpoint``, which torchrun then reads from ``PET_RDZV_ENDPOINT``
  (a batch script learns the first node of its allocation only when it runs);
- one process with ``launcher_for_one=False``: the program alone (a world of one needs no launcher, and saves its
  start-up).
``program`` is what each rank runs: the trainer by default, or a benchmark's or a test's own job runner.
Standard library only.
"""
from __future__ import annotations

import sys
from typing import Sequence

TRAINER = ("-m", "trainer")
TORCHRUN = ("-m", "torch.distributed.run")
ENDPOINT_FROM_ENV = "env"


def trainer_command(args: Sequence[str] = (), *, nproc_per_node: int = 1, nodes: int = 1, endpoint: str = "",
                    rdzv_id: str = "", srun: bool = False, launcher_for_one: bool = True,
                    program: Sequence[str] = TRAINER, python: str = sys.executable) -> list[str]:
    if nproc_per_node < 1 or nodes < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node} and nodes={nodes} must be at least 1")
    if (nodes > 1 or srun) and not endpoint:
        raise ValueError("ranks on several nodes meet at a rendezvous endpoint: give endpoint='<first node>:<port>'")
    rank_program = [*program, *args]
    if nodes == 1 and not srun:
        if nproc_per_node == 1 and not launcher_for_one:
            return [python, *rank_program]
        if not endpoint:
            return [python, *TORCHRUN, "--standalone", f"--nproc_per_node={nproc_per_node}", *rank_program]
        host, _, port = endpoint.rpartition(":")
        return [python, *TORCHRUN, f"--nproc_per_node={nproc_per_node}", f"--master_addr={host}",
                f"--master_port={port}", *rank_program]
    at = [] if endpoint == ENDPOINT_FROM_ENV else [f"--rdzv_endpoint={endpoint}"]
    torchrun = [python, *TORCHRUN, f"--nnodes={nodes}", f"--nproc_per_node={nproc_per_node}", "--rdzv_backend=c10d",
                *at, *([f"--rdzv_id={rdzv_id}"] if rdzv_id else []), *rank_program]
    if srun:
        return ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", *torchrun]
    return torchrun
