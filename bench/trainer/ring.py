"""Section 5 of ``python -m bench.trainer``: ring attention on two ranks (context parallel, cp=2) against one
process's attention over the whole sequence, at several sequence lengths; forward + backward time and peak memory
per rank side by side, with their ratios.

Each rank holds half the sequence (its zig-zag share), so the ideal is half the time and half the memory of one
process; what the ring adds is its K/V hops (point-to-point over gloo here, NCCL on GPUs) and their waits. Each
measurement runs in fresh processes, so that on the CPU a process's peak resident memory above what it held before
the first attention is that attention's (fp32 q, k, v, the output, their gradients and the kernel's buffers); on a
GPU torch.cuda.max_memory_allocated. Times: the median of ``repeats`` forward + backward passes after one warm-up.
Beside them, rank 0's blocks computed in one process with no ring: what a rank takes with free hops and a core of
its own, which two ranks on a machine of two busy cores do not have.
"""
from __future__ import annotations

import os
import resource
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from trainer.parallel import context as blocks
from trainer.parallel.context import ring_attention, zigzag_slice

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64  # grouped-query attention, as Llama's


def _inputs(seq_len: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seq_len)
    q = torch.randn(1, HEADS, seq_len, HEAD_DIM, generator=gen)
    k, v = (torch.randn(1, KV_HEADS, seq_len, HEAD_DIM, generator=gen) for _ in range(2))
    return tuple(t.to(device) for t in (q, k, v))


def _resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _measure(step, device: torch.device, repeats: int) -> tuple[float, float]:
    """(median seconds of ``step``, peak bytes above the start) for this process."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start_bytes = torch.cuda.memory_allocated()
    else:
        start_bytes = _resident_bytes()
    step()  # warm-up: allocator growth, the first connection
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _resident_bytes()
    return statistics.median(times), float(peak - start_bytes)


def _device(rank: int) -> torch.device:
    return torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")


def _one_process(seq_len: int, repeats: int, results) -> None:
    device = _device(0)
    q, k, v = _inputs(seq_len, device)
    group = HEADS // KV_HEADS

    def step():
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1),
                                             is_causal=True)
        out.sum().backward()

    results.put(("one", 0, *_measure(step, device, repeats)))


def _blocks_alone(seq_len: int, repeats: int, results) -> None:
    """Rank 0's share of the ring's compute with no ring: its causal diagonal block and, for cp = 2, the half-block
    of rank 1's keys, forward (merged) and backward, in one process: what a rank would take were the hops free and
    its core its own."""
    device = _device(0)
    q, k, v = (zigzag_slice(t, 2, 0, dim=2) for t in _inputs(seq_len, device))
    c, scale = q.size(2) // 2, HEAD_DIM ** -0.5

    def step():
        out, lse = blocks._block_forward(q, k, v, True, scale)
        out, lse = out.float(), lse.clone()
        blocks._merge(out[:, :, c:], lse[:, :, c:], *blocks._block_forward(q[:, :, c:], k, v, False, scale))
        dout = torch.ones_like(q)
        blocks._block_backward(dout, q, k, v, out, lse, True, scale)
        blocks._block_backward(dout[:, :, c:], q[:, :, c:], k, v, out[:, :, c:], lse[:, :, c:], False, scale)

    results.put(("alone", 0, *_measure(step, device, repeats)))


def _ring_rank(rank: int, port: int, seq_len: int, repeats: int, results) -> None:
    device = _device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2)
    try:
        q, k, v = (zigzag_slice(t, 2, rank, dim=2) for t in _inputs(seq_len, device))

        def step():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            ring_attention(qq, kk, vv, dist.group.WORLD).sum().backward()

        results.put(("ring", rank, *_measure(step, device, repeats)))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(context, target, args_for_rank, ranks: int, results) -> list[tuple]:
    procs = [context.Process(target=target, args=args_for_rank(r)) for r in range(ranks)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=1800) for _ in range(ranks)]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode:
            raise RuntimeError(f"a benchmark process exited with {p.exitcode}")
    return rows


def ring_vs_one(seq_lens: tuple[int, ...] = (1024, 2048, 4096, 8192), repeats: int = 3) -> list[dict]:
    """For each sequence length: one process over the whole sequence, then two ranks of ring attention, each in
    fresh processes (one intra-op thread each on the CPU, so that the two ranks use two cores and one process one)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = mp.get_context("spawn")
    results = context.Queue()
    rows = []
    for seq_len in seq_lens:
        (_, _, one_s, one_bytes), = _run(context, _one_process, lambda r: (seq_len, repeats, results), 1, results)
        (_, _, alone_s, _), = _run(context, _blocks_alone, lambda r: (seq_len, repeats, results), 1, results)
        port = _free_port()
        ring = _run(context, _ring_rank, lambda r: (r, port, seq_len, repeats, results), 2, results)
        ring_s = max(r[2] for r in ring)  # the step waits for the slower rank
        ring_bytes = max(r[3] for r in ring)
        rows.append({"seq_len": seq_len, "one_ms": one_s * 1e3, "ring_ms": ring_s * 1e3,
                     "time_ratio": ring_s / one_s, "alone_ms": alone_s * 1e3, "alone_ratio": alone_s / one_s,
                     "one_mib": one_bytes / 2 ** 20, "ring_mib": ring_bytes / 2 ** 20,
                     "memory_ratio": ring_bytes / one_bytes if one_bytes > 0 else float("nan")})
    return rows


def print_ring_rows(rows: list[dict]) -> None:
    print(f"5. ring attention, cp=2, against one process over the whole sequence: {HEADS} query heads sharing "
          f"{KV_HEADS} key/value heads of {HEAD_DIM}, fp32, causal, forward + backward (median; peak memory per "
          f"rank above its start)")
    print("   seq_len   one process ms   ring ms/rank   ratio   a rank's blocks alone ms   ratio    one process MiB   "
          "ring MiB/rank   ratio")
    for r in rows:
        print(f"   {r['seq_len']:7d}   {r['one_ms']:14.1f}   {r['ring_ms']:12.1f}   {r['time_ratio']:5.2f}   "
              f"{r['alone_ms']:24.1f}   {r['alone_ratio']:5.2f}    {r['one_mib']:15.1f}   {r['ring_mib']:13.1f}   "
              f"{r['memory_ratio']:5.2f}")
    print("   ideal: 0.50 and 0.50 (each rank holds half the sequence and does half the causal work); 'alone': rank "
          "0's blocks in one process,\n   no ring: what a rank takes with free hops and a core of its own\n")
