"""Benchmarks of the training program, printed side by side; ratios, not absolute seconds, are the point.

    python -m bench.trainer [--out DIR] [--steps N] [--pairs N] [--only 1,2,3,4,5] [--text FILE]

1. Engine overhead against a lean GPT-2 loop written in plain PyTorch, in alternating pairs (bench.trainer.overhead).
   Target ratio ≤ 1.05.
2. Pipeline bubble against theory, p=2: 1F1B, interleaved and zero-bubble schedules (bench.trainer.bubble).
3. Saved activations by checkpointing mode against Korthikanti's formula, and for the Llama, Mixtral and Qwen2-MoE
   families against the planner (bench.trainer.activations).
4. ZeRO stages 0–3 on the DeepSpeed engine beside the native DDP and FSDP2 (bench.trainer.zero).
5. Ring attention on two context-parallel ranks against one process, 1 K to 8 K tokens (bench.trainer.ring); not in
   the default set (minutes of attention on a CPU): --only 5.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.trainer.activations import family_rows, saved_activations
from bench.trainer.bubble import pipeline_bubble
from bench.trainer.common import bench_model, sample_text
from bench.trainer.overhead import engine_vs_plain
from bench.trainer.ring import print_ring_rows, ring_vs_one
from bench.trainer.zero import print_zero_rows, zero_step_times
from trainer.contract import DatasetSpec
from trainer.data import prepare_dataset
from trainer.planner.estimate.step_model import BUBBLE, BUBBLE_ZERO


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "trainer-bench"),
                        help="scratch folder for the benchmark runs")
    parser.add_argument("--steps", type=int, default=12,
                        help="steps per run; section 1 times those after its first 5")
    parser.add_argument("--pairs", type=int, default=8, help="section 1: alternating plain/engine pairs")
    parser.add_argument("--micro-batch", type=int, default=4, help="pipeline micro-batch (sequences)")
    parser.add_argument("--only", default="1,2,3,4", help="sections to run, e.g. 2 or 1,3; 5 only when named")
    parser.add_argument("--text", default="", help="training text (default: the demo corpus, first 300 kB)")
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = Path(args.text) if args.text else sample_text(out)
    dataset = DatasetSpec(path=str(text), prepared_dir=str(out / "prepared"))
    prepare_dataset(dataset, 512)

    t0 = time.perf_counter()
    m = bench_model()
    print(f"model (section 1 names its own): {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads, seq "
          f"{m.seq_len}, vocab {m.vocab_size}; fp32 on {'cuda' if torch.cuda.is_available() else 'cpu'}\n")
    sections = set(args.only.split(","))
    if "1" in sections:
        _print_overhead(engine_vs_plain(out, dataset, args.steps, args.pairs))
    if "2" in sections:
        _print_bubble(out, dataset, args)
    if "3" in sections:
        _print_activations()
    if "4" in sections:
        print_zero_rows(zero_step_times(out, dataset, args.steps))
    if "5" in sections:
        print_ring_rows(ring_vs_one())
    print(f"\n(benchmark took {time.perf_counter() - t0:.0f} s; scratch runs in {out})")
    return 0


def _print_overhead(o: dict) -> None:
    m = o["model"]
    print(f"1. engine overhead, dp=tp=pp=1, {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads, vocab "
          f"{m.vocab_size}, batch 8 × seq {m.seq_len}, no clipping (median step after step 5; median ratio of "
          f"{o['pairs']} alternating pairs, range in parentheses)")
    print(f"   lean PyTorch GPT-2 loop (fused qkv, SDPA; outside the project) {o['plain_ms']:8.1f} ms")
    for label, ms, ratio, (low, high) in (
            ("native engine, step_time_s", o["engine_ms"], o["ratio"], o["ratio_range"]),
            ("its loop, row to row", o["loop_ms"], o["loop_ratio"], o["loop_ratio_range"])):
        print(f"   {label:63s} {ms:8.1f} ms   ratio {ratio:.3f} ({low:.2f}–{high:.2f})   target ≤ 1.05")
    print()


def _print_bubble(out: Path, dataset: DatasetSpec, args) -> None:
    print(f"2. pipeline idle fraction, p=2, micro-batch {args.micro_batch} × seq 128: 1F1B, interleaved 1F1B and the "
          f"zero-bubble schedules")
    print("   schedule         m  v   theory   measured stage0/stage1   corrected stage0/stage1 (mean)   ÷ 1F1B's")
    for r in pipeline_bubble(out, dataset, max(args.steps // 2, 7), args.micro_batch):
        meas = "/".join(f"{v:.3f}" for v in r["measured_per_stage"])
        corr = "/".join(f"{v:.3f}" for v in r["corrected_per_stage"])
        against = "" if r["schedule"] == "1f1b" or r["against_1f1b"] is None else f"{r['against_1f1b']:.2f}"
        print(f"   {r['schedule']:15s} {r['m']:2d}  {r['v']}   {r['theory']:.3f}    {meas:>13}            "
              f"{corr:>13} ({r['corrected_mean']:.3f})   {against:>8}   one-process host overhead "
              f"{r['host_overhead_one_process']:.3f}")
    print(f"   theory: b/(1+b) of the step, b = {BUBBLE.expr.text()}, or {BUBBLE_ZERO.expr.text()} for the "
          f"zero-bubble schedules\n")


def _print_activations() -> None:
    rows = saved_activations()
    gqa = saved_activations(positions="rope", n_kv_heads=1)
    print("3. saved activations for one micro-batch (2 × 128 tokens), whole model incl. head and loss")
    print("             learned positions, 4 heads          rotary positions, 4 query heads sharing 1 KV head")
    for r, g in zip(rows[:3], gqa[:3]):
        print(f"   {r['mode']:9s} {r['bytes'] / 2**20:8.2f} MiB   none/this = {r['ratio_to_none']:.2f}×"
              f"        {g['bytes'] / 2**20:8.2f} MiB   none/this = {g['ratio_to_none']:.2f}×")
    f = rows[3]
    print(f"   Korthikanti, blocks only, fp32, no dropout, fused attention: none "
          f"{f['formula_layers_none_fused_attention'] / 2**20:.2f} MiB, full "
          f"{f['formula_layers_full'] / 2**20:.2f} MiB")
    print("   families, one micro-batch of 2 × 64 tokens, measured against the planner (CPU: composite RMSNorm)")
    for r in family_rows():
        precision = r["precision"] + (" cast" if r["zero_stage"] == 3 else " autocast" if r["precision"] != "fp32"
                                      else "")
        print(f"   {r['model']:14s} {r['mode']:9s} {precision:13s} measured {r['measured'] / 2**20:6.2f} MiB   "
              f"planned {r['planned'] / 2**20:6.2f} MiB   planned/measured {r['ratio']:.4f}")


if __name__ == "__main__":
    sys.exit(main())
