"""What the training loop asks of an engine, and what a step gives back.

The loop (``trainer.engine.loop``) owns everything a run does around the model: the run folder, stop requests,
profiling, evaluation, checkpoint cadence and metrics. An engine owns the model and the optimizer as its framework
lays them out: the native engine (torch.distributed on one device mesh) or DeepSpeed. Both train the same seeded
model on the same batches, so their runs can be compared step by step.

A step is one call, ``train_step``, the same for both: forward and backward over this rank's micro-batches, then
the update (gradient reduction, global norm, clipping, the optimizer), answered as a ``StepResult``. The native
engine runs the two halves one after the other; DeepSpeed interleaves them (``engine.step`` after each
micro-batch's backward updates at the accumulation boundary; its pipeline's ``train_batch`` does all of it), so no
engine offers them as separate calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np
import torch

from trainer.contract.manifest import CheckpointManifest
from trainer.engine.runfiles import RunFiles
from trainer.profiling.memory import SavedActivations

MicroBatches = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class StepResult:
    """What one training step did. Every rank holds the same figures, except ``state_bytes`` (this rank's own)."""

    loss: float                 # the mean over the replicas that computed one
    grad_norm: float            # the global norm, before clipping
    applied: bool               # False when fp16 found an overflow and the update was skipped
    loss_scale: float           # as the step leaves it (1 without fp16)
    routing: dict[str, Any] = field(default_factory=dict)  # mixture-of-experts figures, summed over ranks; {} dense
    state_bytes: Optional[dict[str, int]] = None  # a measured step: params, grads, optimizer and activations bytes
    # Seconds this rank spent on its own forward and backward, before it waited for any other rank (None where the
    # plan's backward waits on other ranks on the way: stragglers.ComputeClock)
    compute_s: Optional[float] = None


@dataclass(frozen=True)
class Backward:
    """What forward and backward over one step's micro-batches leave on this rank (under DeepSpeed, after its
    update: the two run interleaved)."""

    loss: torch.Tensor                              # mean loss of the micro-batches (0 where none was computed)
    routing: Optional[dict] = None                  # mixture-of-experts stats accumulated over them
    activations: Optional[SavedActivations] = None  # a measured step's probe of the activations autograd saved


@dataclass(frozen=True)
class Description:
    """What an engine says of itself as the run starts."""

    started: dict[str, Any]  # fields of the "started" event: the plan as this engine runs it, the device
    layout: str              # one log line about the layout


class Engine(Protocol):
    """One rank's side of a run. The constructor joins the job's process group (so the rank is known before anything
    can fail and be recorded); ``build`` makes the rest."""

    rank: int
    world_size: int
    device: torch.device
    dp_rank: int               # which share of the global batch this rank draws
    checkpoint_format: str     # what ``save`` writes, and what ``latest_checkpoint`` looks for

    def describe(self) -> Description:
        """Fields for the "started" event, and one log line about the layout."""

    def build(self) -> None:
        """Model, optimizer and every process group the plan needs, on this rank."""

    def announce(self, files: RunFiles) -> None:
        """Record what only this engine knows once built (rank 0): its config, its own cross-checks."""

    def seed(self, step: int) -> None:
        """Seed this rank's random streams for a run starting (fresh or on another layout) at ``step``."""

    def train_step(self, micro: MicroBatches, lr: float, measure: bool) -> StepResult:
        """One optimizer step at learning rate ``lr`` over this rank's micro-batches: forward and backward, gradient
        reduction, global norm and clipping, the update (skipped on an fp16 overflow), gradients cleared; loss and
        routing figures agreed over the ranks. ``measure``: also count the bytes this rank holds (the first step a
        process runs): model states, gradients at their peak, the activations autograd saves."""

    def evaluate(self, batches: MicroBatches) -> float:
        """The mean loss over ``batches`` (no update), the same on every rank."""

    def pipeline_schedule_record(self) -> dict[str, Any] | None:
        """The pipeline schedule's order of compute actions on every pipeline rank (``schedule_record``), for a
        profile's timeline; None without a pipeline or where the engine runs a schedule of its own."""

    def save(self, run_dir: Path, manifest: CheckpointManifest, keep: int) -> Path:
        """Collective: every rank writes its part; rank 0 writes ``manifest`` last, then prunes to ``keep``."""

    def load(self, folder: Path) -> CheckpointManifest:
        """Collective: restore model, optimizer (and, when the layout is unchanged, random states)."""

    def load_weights(self, folder: Path) -> CheckpointManifest:
        """Collective: the model's weights from a checkpoint of any plan and engine (or an import), nothing else:
        the optimizer stays fresh. Refuses a checkpoint of another model (trainer.checkpoint.weights)."""

    def close(self) -> None: ...
