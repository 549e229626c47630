"""A served model split over tensor-parallel ranks, each its own process: rank 0 schedules, the others follow.

Rank 0 runs the engine. Each iteration it broadcasts the scheduler's plan (``scheduler.Plan``: admissions with
their prefix blocks, restarts, the prefill batches, the saves into the prefix cache, the decode step), once, as a
list of ints, and every follower executes the same plan on its shard, so the all-reduces inside the model
(``model.RowParallel``) meet, and every rank's prefix blocks hold its own heads of the same prefixes. Only rank 0
samples: the followers learn each new token from the next plan.
Gloo on the CPU, NCCL on GPUs (rank r on the r-th GPU after the instance's own).

    python -m workbench_serving.tensor_parallel --folder <version folder> --rank 1 --world 2 --port <p> ...
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .layout import MODEL_SPEC, load_shard, read_json
from .model import BatchLogits, ServingGPT, ServingSpec
from .scheduler import Plan

STOP = -1  # a plan's length, in place of a plan: the followers leave
INIT_TIMEOUT = timedelta(seconds=300)
# Cores a CPU server keeps out of the model's arithmetic, as vLLM's CPU backend keeps one for its engine process:
# Triton's threads, the response thread and a local client need a core between the steps, and an operation's compute
# threads wait at its end for the slowest of them, so one that shares its core with them stalls the whole operation.
RESERVED_CPU_CORES = 1


def device_for(kind: str, base: int, rank: int) -> torch.device:
    return torch.device(f"cuda:{base + rank}") if kind == "gpu" else torch.device("cpu")


def cpu_threads(processes: int, cores: int | None = None) -> int:
    """Compute threads of each of ``processes`` model processes (instances × tensor-parallel ranks) on a CPU server:
    the cores this process may use, less RESERVED_CPU_CORES, shared evenly; at least one."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return max(1, (cores - RESERVED_CPU_CORES) // max(1, processes))


def build_rank_model(folder: Path, rank: int, world: int, slots: int, device: torch.device,
                     dtype: torch.dtype, prefix_blocks: int = 0, threads: int = 0) -> ServingGPT:
    """Rank ``rank``'s shard as a model, computing with ``threads`` threads on a CPU (0: ``cpu_threads(world)``)."""
    if device.type == "cpu":
        torch.set_num_threads(threads or cpu_threads(world))
    spec = ServingSpec.from_dict(read_json(Path(folder) / MODEL_SPEC))
    reduce = (lambda t: dist.all_reduce(t)) if world > 1 else None
    return ServingGPT(spec, load_shard(folder, rank), slots, rank, world, reduce, dtype, device, prefix_blocks)


def join_group(rank: int, world: int, port: int, device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=INIT_TIMEOUT)


def _broadcast(values: list[int], device: torch.device) -> None:
    dist.broadcast(torch.tensor(values, dtype=torch.long, device=device), src=0)


class Leader:
    """Rank 0's view of the split model: the engine's Runner; each plan is broadcast to the followers first."""

    def __init__(self, model: ServingGPT, followers: list[subprocess.Popen]):
        self.model, self.followers = model, followers
        self.slots, self.prefix_blocks, self.block_size = model.slots, model.prefix_blocks, model.block_size
        self._device = _broadcast_device(model)

    def execute(self, plan: Plan) -> list[BatchLogits]:
        values = plan.to_ints()
        _broadcast([len(values)], self._device)
        _broadcast(values, self._device)
        return self.model.execute(plan)

    def close(self) -> None:
        try:
            _broadcast([STOP], self._device)
        finally:
            for p in self.followers:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            dist.destroy_process_group()


def follow(model: ServingGPT) -> None:
    """Execute rank 0's plans until it says stop."""
    device = _broadcast_device(model)
    while True:
        length = torch.zeros(1, dtype=torch.long, device=device)
        dist.broadcast(length, src=0)
        if int(length) == STOP:
            return
        values = torch.zeros(int(length), dtype=torch.long, device=device)
        dist.broadcast(values, src=0)
        model.execute(Plan.from_ints(values.tolist()))


def _broadcast_device(model: ServingGPT) -> torch.device:
    """NCCL broadcasts from the GPU, gloo from the CPU."""
    return model.device if model.device.type == "cuda" else torch.device("cpu")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_executable() -> str:
    """The interpreter for the follower processes: inside Triton's stub, sys.executable is not always Python."""
    return os.environ.get("WORKBENCH_SERVING_PYTHON") or shutil.which("python3") or sys.executable


def start_leader(folder: Path, world: int, slots: int, kind: str, base_device: int,
                 dtype: torch.dtype, prefix_blocks: int = 0, threads: int = 0) -> Leader:
    """Start ranks 1 … world−1 as processes, join them, and return rank 0 over its shard (``threads``: as
    ``build_rank_model`` takes them)."""
    folder = Path(folder)
    port = free_port()
    followers = [subprocess.Popen(
        [python_executable(), "-m", "workbench_serving.tensor_parallel", "--folder", str(folder), "--rank", str(r),
         "--world", str(world), "--port", str(port), "--slots", str(slots), "--kind", kind,
         "--base-device", str(base_device), "--dtype", str(dtype).removeprefix("torch."),
         "--prefix-blocks", str(prefix_blocks), "--threads", str(threads), "--parent", str(os.getpid())],
        cwd=str(folder))
        for r in range(1, world)]
    device = device_for(kind, base_device, 0)
    join_group(0, world, port, device)
    return Leader(build_rank_model(folder, 0, world, slots, device, dtype, prefix_blocks, threads), followers)


def _watch_parent(pid: int) -> None:
    """A follower whose rank 0 is gone would wait in a broadcast for ever: leave instead."""
    while True:
        if os.getppid() != pid:
            os._exit(0)
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench_serving.tensor_parallel")
    parser.add_argument("--folder", required=True)
    for name in ("--rank", "--world", "--port", "--slots", "--base-device", "--parent"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--prefix-blocks", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--kind", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(args.parent,), daemon=True).start()
    device = device_for(args.kind, args.base_device, args.rank)
    join_group(args.rank, args.world, args.port, device)
    model = build_rank_model(Path(args.folder), args.rank, args.world, args.slots, device,
                             getattr(torch, args.dtype), args.prefix_blocks, args.threads)
    follow(model)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
