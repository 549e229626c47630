"""Section 1 of ``python -m bench.trainer``: the engine at dp=tp=pp=1 against a lean plain-PyTorch loop in the same
process. Target ratio ≤ 1.05.

The reference is the loop a user would write outside the project, GPT-2 style: its own small modules (token and
learned position embeddings, pre-LN blocks with one fused q/k/v projection and SDPA causal attention, a GELU MLP
4 × d_model wide, a final LayerNorm, an untied head), AdamW with the trainer's learning rate, betas, epsilon and
weight-decay split, and no gradient clipping; it imports nothing from ``trainer.model``. The engine runs the same
shape with clipping off, so clipping counts on neither side. Both draw the same batches from the project's sampler.

The shape is the section's own (``overhead_model``): 4 layers, d_model 128, 4 heads, seq 128, vocabulary 2,048,
micro-batch 8 = global batch, fp32. The token ids come from the 512-token tokenizer the other sections prepare: the
model's cost does not depend on which ids it reads.

The two run in alternating pairs, so that a slow spell on a busy machine hits both sides of a pair; each side's
figure is its median step after the first ``SKIP`` steps (allocator growth, the engine's memory probe), and the
ratio is the median over the pairs, printed with its range. The engine is timed twice: the step time it records
(``step_time_s``: the batch, ``train_step`` and the synchronisations around it), and the loop's whole round from one
metrics row to the next (the row, the log line, the stop agreement, the checkpoint cadence as well): what a run of
many steps takes per step.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bench.trainer.common import fresh, median_row_interval, median_step
from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec
from trainer.contract.presets import local_cpu_cluster
from trainer.data import BatchSampler, load_tokens, prepare_dataset
from trainer.engine.loop import run

SKIP = 5  # steps left out of each side's median
TOKENIZER = 512  # the tokenizer the benchmark's other sections prepare (python -m bench.trainer)


def overhead_model() -> ModelSpec:
    return ModelSpec(name="overhead", n_layers=4, d_model=128, n_heads=4, seq_len=128, vocab_size=2048,
                     tied_embeddings=False)


def overhead_spec(out: Path, dataset: DatasetSpec, steps: int) -> RunSpec:
    """The engine's side: one process, micro-batch 8 = global batch, fp32, gradients not clipped."""
    plan = ParallelPlan(micro_batch=8, global_batch=8)
    dataset = dataset if dataset.tokenizer_vocab else replace(dataset, tokenizer_vocab=TOKENIZER)
    return RunSpec(model=overhead_model(), plan=plan, cluster=local_cpu_cluster(plan.world_size), dataset=dataset,
                   output_dir=str(out / "overhead-engine"), steps=steps,
                   optimizer=OptimizerSpec(lr=3e-4, warmup_steps=2, grad_clip=0.0)).validate()


# ---- the lean reference ---------------------------------------------------------------------------------------
class LeanBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class LeanGPT(nn.Module):
    def __init__(self, m: ModelSpec):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(m.vocab_size, m.d_model), nn.Embedding(m.seq_len, m.d_model)
        self.blocks = nn.ModuleList(LeanBlock(m.d_model, m.n_heads) for _ in range(m.n_layers))
        self.norm = nn.LayerNorm(m.d_model)
        self.head = nn.Linear(m.d_model, m.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lean_optimizer(model: nn.Module, spec: OptimizerSpec) -> torch.optim.AdamW:
    """The trainer's split: weight decay on matrices and embeddings only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                              {"params": other, "weight_decay": 0.0}],
                             lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.eps)


def plain_loop_step_times(spec: RunSpec, steps: int) -> list[float]:
    """The lean loop's seconds per step: batch, forward, backward, update, and the loss read (as the engine reads
    its own every step)."""
    data = prepare_dataset(spec.dataset, spec.model.vocab_size)
    sampler = BatchSampler(load_tokens(data.train_path), spec.model.seq_len, spec.plan.micro_batch,
                           spec.plan.grad_accum, seed=spec.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(spec.seed)
    model = LeanGPT(spec.model).to(device)
    opt = lean_optimizer(model, spec.optimizer)
    times = []
    for step in range(steps):
        _synchronize(device)
        t0 = time.perf_counter()
        micro = sampler.micro_batches(step)
        for x, y in micro:
            logits = model(torch.from_numpy(x).to(device))
            loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).to(device).flatten())
            (loss / len(micro)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return times


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the pairs ------------------------------------------------------------------------------------------------
def engine_vs_plain(out: Path, dataset: DatasetSpec, steps: int, pairs: int = 8, skip: int = SKIP) -> dict:
    """``steps`` per run (more than ``skip``), ``pairs`` alternating lean-loop and engine runs."""
    if steps <= skip:
        raise ValueError(f"steps={steps} leaves no step after the {skip} skipped")
    spec = overhead_spec(out, dataset, steps)
    plain, engine, loop = [], [], []
    for _ in range(pairs):
        plain.append(statistics.median(plain_loop_step_times(spec, steps)[skip:]))
        run(spec, fresh(Path(spec.output_dir)), resume=False)
        engine.append(median_step(Path(spec.output_dir), skip=skip))
        loop.append(median_row_interval(Path(spec.output_dir), skip=skip))
    ratios = [e / p for e, p in zip(engine, plain)]
    loop_ratios = [w / p for w, p in zip(loop, plain)]
    return {"model": spec.model, "pairs": pairs, "plain_ms": statistics.median(plain) * 1e3,
            "engine_ms": statistics.median(engine) * 1e3, "loop_ms": statistics.median(loop) * 1e3,
            "ratio": statistics.median(ratios), "ratio_range": (min(ratios), max(ratios)),
            "loop_ratio": statistics.median(loop_ratios), "loop_ratio_range": (min(loop_ratios), max(loop_ratios))}
