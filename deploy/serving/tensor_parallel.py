"""A served model split over tensor-parallel ranks, each its own process: rank 0 schedules, the others follow.

Rank 0 runs the engine. Before each model call it broadcasts what the call is (prefill a slot with these ids, or
decode these slots with these tokens); every follower makes the same call on its shard, so the all-reduces inside
the model (``model.RowParallel``) meet. Only rank 0 samples: the followers learn each new token from the next call.
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
from .model import ServingGPT, ServingSpec

PREFILL, DECODE, STOP = 1, 2, 3
INIT_TIMEOUT = timedelta(seconds=300)


def device_for(kind: str, base: int, rank: int) -> torch.device:
    return torch.device(f"cuda:{base + rank}") if kind == "gpu" else torch.device("cpu")


def build_rank_model(folder: Path, rank: int, world: int, slots: int, device: torch.device,
                     dtype: torch.dtype) -> ServingGPT:
    spec = ServingSpec.from_dict(read_json(Path(folder) / MODEL_SPEC))
    reduce = (lambda t: dist.all_reduce(t)) if world > 1 else None
    return ServingGPT(spec, load_shard(folder, rank), slots, rank, world, reduce, dtype, device)


def join_group(rank: int, world: int, port: int, device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=INIT_TIMEOUT)


def _broadcast(values: list[int], device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.long, device=device)
    dist.broadcast(t, src=0)
    return t


class Leader:
    """Rank 0's view of the split model: the engine's Runner; each call is announced to the followers first."""

    def __init__(self, model: ServingGPT, followers: list[subprocess.Popen]):
        self.model, self.followers = model, followers
        self.slots = model.slots
        self._device = model.device if model.device.type == "cuda" else torch.device("cpu")

    def _announce(self, op: int, slot: int, payload: list[int]) -> None:
        _broadcast([op, len(payload), slot], self._device)
        if payload:
            _broadcast(payload, self._device)

    def prefill(self, slot: int, ids: list[int]) -> torch.Tensor:
        self._announce(PREFILL, slot, list(ids))
        return self.model.prefill(slot, ids)

    def decode(self, slots: list[int], tokens: list[int]) -> torch.Tensor:
        self._announce(DECODE, 0, list(slots) + list(tokens))
        return self.model.decode(slots, tokens)

    def length(self, slot: int) -> int:
        return self.model.length(slot)

    def close(self) -> None:
        try:
            self._announce(STOP, 0, [])
        finally:
            for p in self.followers:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            dist.destroy_process_group()


def follow(model: ServingGPT) -> None:
    device = model.device if model.device.type == "cuda" else torch.device("cpu")
    while True:
        header = torch.zeros(3, dtype=torch.long, device=device)
        dist.broadcast(header, src=0)
        op, n, slot = (int(x) for x in header)
        if op == STOP:
            return
        payload = torch.zeros(n, dtype=torch.long, device=device)
        dist.broadcast(payload, src=0)
        values = payload.tolist()
        if op == PREFILL:
            model.prefill(slot, values)
        else:
            model.decode(values[:n // 2], values[n // 2:])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_executable() -> str:
    """The interpreter for the follower processes: inside Triton's stub, sys.executable is not always Python."""
    return os.environ.get("WORKBENCH_SERVING_PYTHON") or shutil.which("python3") or sys.executable


def start_leader(folder: Path, world: int, slots: int, kind: str, base_device: int,
                 dtype: torch.dtype) -> Leader:
    """Start ranks 1 … world−1 as processes, join them, and return rank 0 over its shard."""
    folder = Path(folder)
    port = free_port()
    followers = [subprocess.Popen(
        [python_executable(), "-m", "workbench_serving.tensor_parallel", "--folder", str(folder), "--rank", str(r),
         "--world", str(world), "--port", str(port), "--slots", str(slots), "--kind", kind,
         "--base-device", str(base_device), "--dtype", str(dtype).removeprefix("torch."),
         "--parent", str(os.getpid())], cwd=str(folder)) for r in range(1, world)]
    device = device_for(kind, base_device, 0)
    join_group(0, world, port, device)
    return Leader(build_rank_model(folder, 0, world, slots, device, dtype), followers)


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
    parser.add_argument("--kind", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(args.parent,), daemon=True).start()
    device = device_for(args.kind, args.base_device, args.rank)
    join_group(args.rank, args.world, args.port, device)
    model = build_rank_model(Path(args.folder), args.rank, args.world, args.slots, device,
                             getattr(torch, args.dtype))
    follow(model)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
