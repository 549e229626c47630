"""Section 1 of ``python -m bench.trainer``: the engine at dp=tp=pp=1 against a minimal plain-PyTorch loop (same
model, same batch, AdamW, clipping) in the same process. Target ratio ≤ 1.05.

The two run in alternating pairs, so that a slow spell on a busy machine hits both sides of a pair; each side's
figure is its median step after two warm-up steps, and the ratio is the median over the pairs, printed with its
range. The engine is timed twice: the step time it records (``step_time_s``: the batch, ``train_step`` and the
synchronisations around it), and the loop's whole round from one metrics row to the next (the row, the log line,
the stop agreement, the checkpoint cadence as well): what a run of many steps takes per step.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from bench.trainer.common import bench_spec, fresh, median_row_interval, median_step
from trainer.contract import DatasetSpec, RunSpec
from trainer.data import BatchSampler, load_tokens, prepare_dataset
from trainer.engine.loop import run
from trainer.model import build_model, loss_fn


def plain_loop_step_times(spec: RunSpec, steps: int) -> list[float]:
    """The same training step written as directly as PyTorch allows: the yardstick for the engine's overhead."""
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


def engine_vs_plain(out: Path, dataset: DatasetSpec, steps: int, pairs: int = 8) -> dict:
    spec = bench_spec(out, "overhead-engine", dataset, steps, micro_batch=8, global_batch=8)
    plain, engine, loop = [], [], []
    for _ in range(pairs):
        plain.append(statistics.median(plain_loop_step_times(spec, steps)[2:]))
        run(spec, fresh(Path(spec.output_dir)), resume=False)
        engine.append(median_step(Path(spec.output_dir)))
        loop.append(median_row_interval(Path(spec.output_dir)))
    ratios = [e / p for e, p in zip(engine, plain)]
    loop_ratios = [w / p for w, p in zip(loop, plain)]
    return {"pairs": pairs, "plain_ms": statistics.median(plain) * 1e3, "engine_ms": statistics.median(engine) * 1e3,
            "loop_ms": statistics.median(loop) * 1e3,
            "ratio": statistics.median(ratios), "ratio_range": (min(ratios), max(ratios)),
            "loop_ratio": statistics.median(loop_ratios), "loop_ratio_range": (min(loop_ratios), max(loop_ratios))}
