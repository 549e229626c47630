"""What the training loop asks of an engine, and what a step gives back.

The loop (``trainer.engine.loop``) owns everything a run does around the model: the run folder, stop requests,
profiling, evaluation and checkpoint cadence, metrics. An engine owns the model and the optimizer as its framework
lays them out: the native engine (torch.distributed on one device mesh) or DeepSpeed. Both train the same seeded
model on the same batches, so their runs can be compared step by step.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np
import torch

from trainer.contract.manifest import CheckpointManifest
from trainer.engine.runfiles import RunFiles

MicroBatches = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step did on this rank."""

    grad_norm: float
    applied: bool               # False when fp16 found an overflow and the step was skipped
    loss_scale: float
    state_bytes: Optional[dict[str, int]] = None  # on a measured step: params, grads, optimizer, activations bytes


class Engine(Protocol):
    """One rank's side of a run. The constructor joins the job's process group (so the rank is known before anything
    can fail and be recorded); ``build`` makes the rest."""

    rank: int
    world_size: int
    device: torch.device
    dp_rank: int               # which share of the global batch this rank draws
    checkpoint_format: str     # what ``save`` writes, and what ``latest_checkpoint`` looks for

    def describe(self) -> tuple[dict[str, Any], str]:
        """Fields for the "started" event, and one log line about the layout."""

    def build(self) -> None:
        """Model, optimizer and every process group the plan needs, on this rank."""

    def announce(self, files: RunFiles) -> None:
        """Record what only this engine knows once built (rank 0): its config, its own cross-checks."""

    def seed(self, step: int) -> None:
        """Seed this rank's random streams for a run starting (fresh or on another layout) at ``step``."""

    def set_lr(self, lr: float) -> None: ...

    def forward_backward(self, micro: MicroBatches, measure: bool) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches; the mean loss it saw. ``measure``: probe the
        activations autograd saves (first step only)."""

    def step(self, measure: bool) -> StepOutcome:
        """Reduce gradients where backward did not, clip to the global norm, update, clear the gradients."""

    def mean_loss(self, local: torch.Tensor) -> float:
        """The step's loss as every rank reports it: the mean over the replicas that computed one."""

    def routing_metrics(self) -> dict[str, Any]:
        """Mixture-of-experts figures of the last step, summed over ranks; {} for a dense model."""

    def evaluate(self, batches: MicroBatches) -> float: ...

    def pipeline_schedule_record(self) -> dict[str, Any] | None:
        """The pipeline schedule's order of compute actions on every pipeline rank (``schedule_record``), for a
        profile's timeline; None without a pipeline or where the engine runs a schedule of its own."""

    def save(self, run_dir: Path, manifest: CheckpointManifest, keep: int) -> Path:
        """Collective: every rank writes its part; rank 0 writes ``manifest`` last, then prunes to ``keep``."""

    def load(self, folder: Path) -> CheckpointManifest:
        """Collective: restore model, optimizer (and, when the layout is unchanged, random states)."""

    def close(self) -> None: ...
