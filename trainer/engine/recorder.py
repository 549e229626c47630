"""From a step's result to the metrics row rank 0 writes, and the log line of every ``log_every``-th step."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist

from trainer.contract import RunSpec
from trainer.contract.records import RANK_FIGURES, StepMetrics
from trainer.engine.base import Engine, StepResult
from trainer.engine.runfiles import RunFiles
from trainer.planner.estimate.flops import mfu, model_flops_per_step
from trainer.profiling.memory import max_allocated_bytes


class StepRecorder:
    """Turns each step's ``StepResult`` into a ``StepMetrics`` row. The first step a process runs is the measured
    one (``measuring``): its bytes go into every later row's memory, and every rank's are gathered with it once. In a
    multi-rank job each row also carries every rank's RANK_FIGURES (one small all-gather a step)."""

    def __init__(self, spec: RunSpec, engine: Engine, files: RunFiles):
        self.spec, self.engine, self.files = spec, engine, files
        self.tokens_per_step = spec.plan.global_batch * spec.model.seq_len
        self.flops_per_step = model_flops_per_step(spec.model, spec.plan.global_batch)
        self.state_bytes: Optional[dict[str, int]] = None  # this rank's, from the measured step

    @property
    def measuring(self) -> bool:
        """Whether the next step is to measure the bytes of every state (the first this process runs)."""
        return self.state_bytes is None

    def record(self, result: StepResult, step: int, tokens_seen: int, lr: float, step_time: float) -> dict[str, list]:
        """``step``: the number of steps done, this one included; ``step_time``: its seconds, synchronised. Returns
        every rank's RANK_FIGURES of the step (empty in a world of one)."""
        engine, spec = self.engine, self.spec
        first = self.state_bytes is None
        if first:
            self.state_bytes = result.state_bytes
        memory = {**self.state_bytes, "max_allocated_bytes": max_allocated_bytes(engine.device)}
        if first and engine.world_size > 1:
            memory["per_rank"] = _gather_objects(self.state_bytes, engine.world_size)
        tokens_per_s = self.tokens_per_step / step_time
        ranks = _gather_figures(engine, (step_time, tokens_per_s, memory["max_allocated_bytes"], result.compute_s))
        self.files.metric(StepMetrics(
            step=step, loss=result.loss, lr=lr, grad_norm=result.grad_norm, tokens_per_s=tokens_per_s,
            step_time_s=step_time, tokens_seen=tokens_seen, flops_per_step=self.flops_per_step,
            loss_scale=result.loss_scale, skipped=not result.applied,
            mfu=mfu(self.flops_per_step, step_time, spec.cluster.gpu.peak_tflops, engine.world_size), memory=memory,
            routing=result.routing, ranks=ranks))
        if step % spec.log_every == 0:
            self.files.log(f"step {step} loss {result.loss:.4f} lr {lr:.2e} grad_norm {result.grad_norm:.3f} "
                           f"{step_time * 1000:.1f} ms")
        return ranks


def _gather_objects(state_bytes: dict, world_size: int) -> list[dict]:
    """Every rank's bytes (each holds different shards, stages or experts)."""
    everyone = [None] * world_size
    dist.all_gather_object(everyone, state_bytes)
    return everyone


def _gather_figures(engine: Engine, figures: tuple[float, float, int | None, float | None]) -> dict[str, list]:
    """Every rank's RANK_FIGURES of this step, in one all-gather of four float64s (exact for bytes below 2^53);
    a world of one sends nothing."""
    if engine.world_size == 1:
        return {}
    # a device that does not report its memory (the CPU) sends NaN, written as null
    mine = torch.tensor([math.nan if f is None else f for f in figures], dtype=torch.float64, device=engine.device)
    everyone = [torch.empty_like(mine) for _ in range(engine.world_size)]
    dist.all_gather(everyone, mine)
    table = torch.stack(everyone).tolist()
    out = {name: [row[i] for row in table] for i, name in enumerate(RANK_FIGURES)}
    out["max_allocated_bytes"] = [None if math.isnan(b) else int(b) for b in out["max_allocated_bytes"]]
    out["compute_s"] = [None if math.isnan(c) else c for c in out["compute_s"]]
    return out
