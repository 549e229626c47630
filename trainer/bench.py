"""Benchmarks of the native engine, printed side by side; ratios, not absolute seconds, are the point.

    python -m trainer.bench [--out DIR] [--steps N] [--text FILE]

1. Engine overhead: median step time of the engine at dp=tp=pp=1 against a minimal plain-PyTorch loop (same
   model, same batch, AdamW, clipping) in the same process. Target ratio ≤ 1.05.
2. Pipeline bubble: measured idle fraction of each stage (torch.profiler, trainer.profiling) for p=2 and
   m=2, 4, 8 micro-batches, against (p−1)/(m+p−1); and the interleaved schedule (v=2) against (p−1)/(v·m+p−1). A one-process run of the same micro-batches gives the host
   overhead every step has anyway; "corrected" = 1 − compute share(pipeline) / compute share(one process).
3. Saved activations for none, selective and full activation checkpointing (one micro-batch, measured with
   saved_tensors_hooks), beside Korthikanti et al.'s per-layer formula for this layer in fp32 without dropout.
4. ZeRO stages 0–3 on the DeepSpeed engine at dp=2, with the native DDP and FSDP2 beside them (trainer.ds.bench).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PIPELINE_MICROBATCHES = (2, 4, 8)


def _bench_model(layers: int = 4, d_model: int = 256, seq_len: int = 128):
    from trainer.contract import ModelSpec

    return ModelSpec(name="bench", n_layers=layers, d_model=d_model, n_heads=4, seq_len=seq_len, vocab_size=512,
                     tied_embeddings=False)


def _spec(out: Path, name: str, dataset, steps: int, world: int = 1, profile=None, **plan):
    from trainer.contract.presets import local_cpu_cluster
    from trainer.contract import OptimizerSpec, ParallelPlan, RunSpec

    plan_obj = ParallelPlan(**plan)
    return RunSpec(model=_bench_model(), plan=plan_obj, cluster=local_cpu_cluster(plan_obj.world_size),
                   dataset=dataset, output_dir=str(out / name), steps=steps, profile=profile,
                   optimizer=OptimizerSpec(lr=3e-4, warmup_steps=2)).validate()


def _median_step(run_dir: Path, skip: int = 2) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r][skip:]
    return statistics.median(times)


def _fresh(path: Path) -> Path:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    return path


# ---------------------------------------------------------------- 1. engine against a plain loop


def plain_loop_step_times(spec, steps: int) -> list[float]:
    """The same training step written as directly as PyTorch allows: the yardstick for the engine's overhead."""
    import torch

    from trainer.data import BatchSampler, load_tokens, prepare_dataset
    from trainer.model import build_model, loss_fn

    data = prepare_dataset(spec.dataset, spec.model.vocab_size)
    sampler = BatchSampler(load_tokens(data.train_path), spec.model.seq_len, spec.plan.micro_batch,
                           spec.plan.grad_accum, seed=spec.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(spec.model, spec.seed).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=spec.optimizer.lr, betas=(0.9, 0.95))
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        micro = sampler.micro_batches(step)
        for x, y in micro:
            loss = loss_fn(model(torch.from_numpy(x).to(device)), torch.from_numpy(y).to(device))
            (loss / len(micro)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the engine reads its loss every step too
        times.append(time.perf_counter() - t0)
    return times


def engine_vs_plain(out: Path, dataset, steps: int) -> dict:
    from trainer.train import run

    spec = _spec(out, "overhead-engine", dataset, steps, micro_batch=8, global_batch=8)
    plain, engine = [], []
    for attempt in range(2):  # alternate, so that a slow spell on a shared machine hits both
        plain.append(statistics.median(plain_loop_step_times(spec, steps)[2:]))
        run(spec, _fresh(Path(spec.output_dir)), resume=False)
        engine.append(_median_step(Path(spec.output_dir)))
    p, e = min(plain), min(engine)
    return {"plain_ms": p * 1e3, "engine_ms": e * 1e3, "ratio": e / p}


# ---------------------------------------------------------------- 2. pipeline bubble


def _pipeline_specs(out: Path, dataset, steps: int, micro_batch: int):
    from trainer.contract import ProfileSpec

    profile = ProfileSpec(start_step=3, steps=3, warmup=1, name="bubble")
    specs = {}
    for m in PIPELINE_MICROBATCHES:
        specs[("pp2", m)] = _spec(out, f"bubble-pp2-m{m}", dataset, steps, profile=profile, pp=2,
                                  micro_batch=micro_batch, global_batch=m * micro_batch, pipeline_schedule="1f1b")
        specs[("pp1", m)] = _spec(out, f"bubble-pp1-m{m}", dataset, steps, profile=profile, pp=1,
                                  micro_batch=micro_batch, global_batch=m * micro_batch)
        if m >= 2 * 2:  # interleaved 1F1B, v=2 chunks of one block each per rank (needs m ≥ p; 4 and 8 shown)
            specs[("pp2v2", m)] = _spec(out, f"bubble-pp2v2-m{m}", dataset, steps, profile=profile, pp=2,
                                        micro_batch=micro_batch, global_batch=m * micro_batch,
                                        pipeline_schedule="interleaved", virtual_stages=2)
    return specs


def _compute_share(run_dir: Path) -> list[float]:
    summary = json.loads((run_dir / "profiles" / "bubble" / "summary.json").read_text())
    return [r["shares"]["compute"] for r in sorted(summary["ranks"], key=lambda r: r["rank"])]


def pipeline_bubble(out: Path, dataset, steps: int, micro_batch: int) -> list[dict]:
    import torch

    from trainer.train import run

    specs = _pipeline_specs(out, dataset, steps, micro_batch)
    jobs = [{"spec": s.to_dict(), "run_dir": s.output_dir} for (kind, _), s in specs.items() if kind != "pp1"]
    for s in specs.values():
        _fresh(Path(s.output_dir))
    _torchrun(2, jobs, out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like each pipeline rank (OMP_NUM_THREADS=1), so that host overhead compares
    try:
        for (kind, _), s in specs.items():
            if kind == "pp1":
                run(s, Path(s.output_dir), resume=False)
    finally:
        torch.set_num_threads(threads)
    rows = []
    p = 2
    for kind, m in specs:
        if kind == "pp1":
            continue
        v = 2 if kind == "pp2v2" else 1
        piped = _compute_share(Path(specs[(kind, m)].output_dir))
        alone = _compute_share(Path(specs[("pp1", m)].output_dir))[0]
        raw = [1 - c for c in piped]
        corrected = [1 - c / alone for c in piped]
        # bubble (p−1)/(v·m) of the ideal time is (p−1)/(v·m + p−1) of the whole step
        rows.append({"m": m, "v": v, "theory": (p - 1) / (v * m + p - 1), "measured_per_stage": raw,
                     "corrected_per_stage": corrected, "corrected_mean": sum(corrected) / len(corrected),
                     "host_overhead_one_process": 1 - alone})
    return sorted(rows, key=lambda r: (r["v"], r["m"]))


def _torchrun(nproc: int, jobs: list[dict], out: Path) -> None:
    import socket

    path = out / "bench-jobs.json"
    path.write_text(json.dumps(jobs))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={port}", "-m", "trainer.bench", "--worker", str(path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")


def _worker(path: str) -> int:
    import torch.distributed as dist

    from trainer.contract import RunSpec
    from trainer.train import run

    for job in json.loads(Path(path).read_text()):
        run(RunSpec.from_dict(job["spec"]), Path(job["run_dir"]), resume=False)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- 3. saved activations


def saved_activations(micro_batch: int = 2, **model_changes) -> list[dict]:
    import torch

    from trainer.memory import SavedActivations
    from trainer.model import build_model, loss_fn
    from trainer.parallel.ac import apply_ac

    spec = _bench_model().replace(**model_changes)
    s, b, h, L = spec.seq_len, micro_batch, spec.d_model, spec.n_layers
    rows = []
    x = torch.randint(0, spec.vocab_size, (b, s), generator=torch.Generator().manual_seed(0))
    for mode in ("none", "selective", "full"):
        model = build_model(spec, 0)
        apply_ac(model, mode)
        with SavedActivations(model.parameters()) as probe:
            loss = loss_fn(model(x), x)
        loss.backward()
        rows.append({"mode": mode, "bytes": probe.bytes})
    # Korthikanti Table 2 for fp32 without dropout: every 2-byte term doubles, mask terms vanish:
    # s·b·h·(34 − 2)·2 + the attention scores 5·a·s²·b → (4·a·s²·b for softmax in/out in fp32, 0 with a fused kernel)
    korthikanti_none = L * s * b * h * 32 * 2
    korthikanti_full = L * 2 * s * b * h * 2
    for r in rows:
        r["ratio_to_none"] = rows[0]["bytes"] / r["bytes"]
    return rows + [{"formula_layers_none_fused_attention": korthikanti_none,
                    "formula_layers_full": korthikanti_full}]


# ---------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/trainer-bench", help="scratch folder for the benchmark runs")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--micro-batch", type=int, default=4, help="pipeline micro-batch (sequences)")
    parser.add_argument("--only", default="1,2,3,4", help="sections to run, e.g. 2 or 1,3")
    parser.add_argument("--text", default="", help="training text (default: the demo corpus, first 300 kB)")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args.worker)

    from trainer.contract import DatasetSpec

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = Path(args.text) if args.text else _sample_text(out)
    dataset = DatasetSpec(path=str(text), prepared_dir=str(out / "prepared"))
    from trainer.data import prepare_dataset

    prepare_dataset(dataset, 512)

    t0 = time.perf_counter()
    m = _bench_model()
    print(f"model: {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads, seq {m.seq_len}, vocab "
          f"{m.vocab_size}; fp32 on {'cuda' if _cuda() else 'cpu'}\n")

    sections = set(args.only.split(","))
    if "1" in sections:
        overhead = engine_vs_plain(out, dataset, args.steps)
        print("1. engine overhead, dp=tp=pp=1, batch 8 × seq 128 (median step)")
        print(f"   plain PyTorch loop {overhead['plain_ms']:8.1f} ms")
        print(f"   native engine      {overhead['engine_ms']:8.1f} ms   ratio {overhead['ratio']:.3f} "
              f"(target ≤ 1.05)\n")
    if "2" in sections:
        _print_bubble(out, dataset, args)
    if "3" in sections:
        _print_activations()
    if "4" in sections:
        from trainer.ds.bench import print_zero_rows, zero_step_times

        spec_for = lambda name, **plan: _spec(out, name, dataset, args.steps, **plan)  # noqa: E731
        print_zero_rows(zero_step_times(out, dataset, args.steps, spec_for, _torchrun))
    print(f"\n(benchmark took {time.perf_counter() - t0:.0f} s; scratch runs in {out})")
    return 0


def _print_bubble(out: Path, dataset, args) -> None:
    print(f"2. pipeline idle fraction, p=2, micro-batch {args.micro_batch} × seq 128; 1F1B (v=1) and interleaved "
          f"1F1B (v=2)")
    print("    m  v   theory (p−1)/(v·m+p−1)   measured stage0/stage1   corrected stage0/stage1 (mean)")
    for r in pipeline_bubble(out, dataset, max(args.steps // 2, 7), args.micro_batch):
        meas = "/".join(f"{v:.3f}" for v in r["measured_per_stage"])
        corr = "/".join(f"{v:.3f}" for v in r["corrected_per_stage"])
        print(f"   {r['m']:2d}  {r['v']}   {r['theory']:.3f}                    {meas:>13}            {corr:>13} "
              f"({r['corrected_mean']:.3f})   one-process host overhead {r['host_overhead_one_process']:.3f}")
    print()


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
          f"{f['formula_layers_none_fused_attention'] / 2**20:.2f} MiB, full {f['formula_layers_full'] / 2**20:.2f} MiB")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sample_text(out: Path) -> Path:
    from trainer.contract.presets import demo_text

    dst = out / "text.txt"
    if not dst.exists():
        dst.write_bytes(demo_text(300_000))
    return dst


if __name__ == "__main__":
    sys.exit(main())
