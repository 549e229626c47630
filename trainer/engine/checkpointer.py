"""Where a run starts, and when it saves.

``start_from``: the newest complete checkpoint of the run folder when resuming, else step 0. ``Checkpointer``: every
``checkpoint_every`` steps, at a stop, and at the end of a finished run whose last step is not saved yet.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from trainer.contract import RunSpec
from trainer.contract.manifest import CheckpointManifest, latest_checkpoint
from trainer.contract.records import Event
from trainer.engine.base import Engine
from trainer.engine.runfiles import RunFiles


@dataclass(frozen=True)
class Start:
    """Where the loop begins: step 0, or the step and token count of the checkpoint it resumed from."""

    step: int = 0
    tokens_seen: int = 0
    resumed_from: Optional[Path] = None


def start_from(engine: Engine, run_dir: Path, resume: bool, spec: RunSpec, files: RunFiles) -> Start:
    """Load the newest complete checkpoint when resuming (none found: step 0, said in the log); seed the random
    streams wherever the checkpoint's could not be restored rank by rank (a fresh run, another layout)."""
    folder = latest_checkpoint(run_dir, engine.checkpoint_format) if resume else None
    if resume and folder is None:
        files.log("--resume given but no complete checkpoint found: starting from step 0")
    if folder is None:
        engine.seed(0)
        return Start()
    manifest = engine.load(folder)
    files.log(f"resumed from {folder} at step {manifest.step}")
    if not manifest.same_layout(spec.plan):
        engine.seed(manifest.step)
    return Start(step=manifest.step, tokens_seen=manifest.tokens_seen, resumed_from=folder)


class Checkpointer:
    """Saves the run every ``checkpoint_every`` steps and when it stops early; a finished run's last step too, unless
    it is saved already (``checkpoint_every`` 0: only a stop saves). Every save is collective."""

    def __init__(self, spec: RunSpec, engine: Engine, run_dir: Path, files: RunFiles, tokenizer: Path, start: Start):
        self.spec, self.engine, self.run_dir, self.files = spec, engine, run_dir, files
        self.manifest = CheckpointManifest(step=start.step, format=engine.checkpoint_format,
                                           tokens_seen=start.tokens_seen, model=spec.model.to_dict(),
                                           plan=spec.plan.to_dict(), world_size=spec.plan.world_size,
                                           tokenizer=str(tokenizer), seed=spec.seed, run=spec.name)
        self.last_saved = start.step if start.resumed_from is not None else -1

    def after_step(self, step: int, tokens_seen: int, stopping: bool) -> None:
        every = self.spec.checkpoint_every
        if (every and step % every == 0) or stopping:
            self.save(step, tokens_seen)

    def at_end(self, step: int, tokens_seen: int) -> None:
        """The run finished: its last step, unless saved already."""
        if self.spec.checkpoint_every and self.last_saved != step:
            self.save(step, tokens_seen)

    def save(self, step: int, tokens_seen: int) -> None:
        t0 = time.perf_counter()
        manifest = replace(self.manifest, step=step, tokens_seen=tokens_seen)
        folder = self.engine.save(self.run_dir, manifest, self.spec.keep_checkpoints)
        self.last_saved = step
        self.files.event(Event.CHECKPOINT_SAVED, step=step, path=str(folder.relative_to(self.run_dir)),
                         tokens_seen=tokens_seen)
        self.files.log(f"checkpoint step {step} saved in {time.perf_counter() - t0:.2f} s")
