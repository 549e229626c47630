"""Loss spikes: a step whose loss is not finite, or far above the steps before it, sends the run back to its newest
checkpoint, and the batches from there to the spike are skipped (the remedy of PaLM and OPT's logbooks: a spike
that a few batches set off does not come back once they are left out). A second spike that would send the run back
to the same checkpoint is not the data's doing: the run stops and says so.

Every rank sees the same loss (the step's mean over the world), so every rank decides alike without a collective.
The skips are the run folder's ``skipped_batches.json`` (records.Skip), read again by a resumed attempt: the batch a
step draws is a pure function of the seed and the step, and ``DataSkips.data_step`` shifts the step past what was
skipped before it.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trainer.contract.manifest import latest_checkpoint, read_manifest
from trainer.contract.records import Skip


class LossDiverged(RuntimeError):
    """The loss spiked again where a rollback had already skipped batches: another attempt would do the same."""

    retry = False  # read by RunFiles.failure_recorded: the workbench does not restart the run for it


@dataclass(frozen=True)
class Spike:
    step: int                  # the steps done, the spike's included
    loss: float
    median: Optional[float]    # of the window before it (None: not yet a full window)

    def describe(self, factor: float) -> str:
        if not math.isfinite(self.loss):
            return f"the loss of step {self.step} is {self.loss}"
        return (f"the loss of step {self.step} is {self.loss:.4g}, {self.loss / self.median:.1f}× the median "
                f"{self.median:.4g} of the steps before it (spike_factor {factor:g})")


class SpikeGuard:
    """Judges each step's loss against the median of the ``window`` steps before it in this process (after a start,
    only a loss that is not finite is judged until the window has filled). A spike does not enter the window."""

    def __init__(self, factor: float, window: int):
        self.factor = factor
        self.recent: deque[float] = deque(maxlen=window)

    def check(self, step: int, loss: float) -> Optional[Spike]:
        full = len(self.recent) == self.recent.maxlen
        median = statistics.median(self.recent) if full else None
        if not math.isfinite(loss) or (self.factor and median is not None and loss > self.factor * median):
            return Spike(step, loss, median)
        self.recent.append(loss)
        return None


@dataclass(frozen=True)
class RollBack:
    """Where a spike sends the run: the checkpoint to load, and the batches skipped from there."""

    folder: Path
    skip: Skip


class DataSkips:
    """The run's skips, and the step whose batch each step trains on."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.skips = Skip.read_all(run_dir)

    def data_step(self, step: int) -> int:
        """The step whose batch the step after ``step`` steps done draws: past every batch skipped before it."""
        return step + sum(s.batches for s in self.skips if s.after_step <= step)

    def roll_back(self, spike: Spike, factor: float, format: str, write: bool) -> RollBack:
        """The checkpoint (of ``format``) to go back to for ``spike``, and the skip that goes with it (recorded when
        ``write``: on rank 0). Raises LossDiverged when there is none to go back to, or the run went back there
        already."""
        folder = latest_checkpoint(self.run_dir, format)
        manifest = read_manifest(folder) if folder else None
        if manifest is None:
            raise LossDiverged(f"{spike.describe(factor)}, and the run has no checkpoint to go back to: save "
                               f"checkpoints more often (checkpoint_every), or lower the learning rate")
        earlier = next((s for s in self.skips if s.after_step == manifest.step), None)
        if earlier is not None:
            raise LossDiverged(
                f"{spike.describe(factor)}: the loss spiked again after the run went back to step {manifest.step} "
                f"and skipped the batches of steps {earlier.after_step + 1}–{earlier.spike_step}. Skipping data "
                f"does not help here: lower the learning rate, lengthen the warm-up, or clip gradients harder")
        skip = Skip(after_step=manifest.step, spike_step=spike.step,
                    loss=spike.loss if math.isfinite(spike.loss) else None, median=spike.median)
        self.skips.append(skip)
        if write:
            Skip.write_all(self.run_dir, self.skips)
        return RollBack(folder, skip)
