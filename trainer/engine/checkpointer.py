"""Where a run starts, and when it saves.

``start_from``: the newest complete checkpoint of the run folder when resuming; else step 0, from the weights of the
checkpoint ``init_from`` names (any plan, either engine, or an import: weights only, a fresh optimizer) or from the
seeded initialisation. ``Checkpointer``: every ``checkpoint_every`` steps, at a stop, and at the end of a finished
run whose last step is not saved yet; each manifest records the checkpoint the run started from (its lineage).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from trainer.contract import RunSpec
from trainer.contract.manifest import CheckpointManifest, latest_checkpoint, read_manifest
from trainer.contract.records import Event
from trainer.engine.base import Engine
from trainer.engine.runfiles import RunFiles


@dataclass(frozen=True)
class Start:
    """Where the loop begins: step 0, or the step and token count of the checkpoint it resumed from."""

    step: int = 0
    tokens_seen: int = 0
    resumed_from: Optional[Path] = None
    started_from: Optional[Path] = None  # the checkpoint whose weights a run at step 0 started from (init_from)


def init_source(spec: RunSpec) -> Optional[Path]:
    """The checkpoint folder ``init_from`` names, made absolute (as manifests record it), or None."""
    return Path(spec.init_from.checkpoint).expanduser().resolve() if spec.init_from is not None else None


def init_tokenizer(spec: RunSpec) -> Optional[Path]:
    """The tokenizer the dataset is to be tokenized with: the init_from checkpoint's when ``keep_tokenizer``,
    else None (the dataset's own, trained by prepare). Read from the manifest, before any engine is built."""
    source = init_source(spec)
    if source is None or not spec.init_from.keep_tokenizer:
        return None
    manifest = read_manifest(source)
    if manifest is None:
        raise ValueError(f"init_from.checkpoint {source} has no readable manifest.json: it is not a complete "
                         f"checkpoint")
    if not manifest.tokenizer:
        raise ValueError(f"the checkpoint {source} records no tokenizer: set init_from.keep_tokenizer to false to "
                         f"tokenize the dataset with a tokenizer trained on it")
    tokenizer = Path(manifest.tokenizer)
    if not tokenizer.is_absolute():  # recorded relative to the checkpoint folder
        tokenizer = source / tokenizer
    if not tokenizer.is_file():
        raise ValueError(f"the checkpoint {source} names the tokenizer {tokenizer}, which does not exist: copy it "
                         f"back, or set init_from.keep_tokenizer to false")
    return tokenizer


def start_from(engine: Engine, run_dir: Path, resume: bool, spec: RunSpec, files: RunFiles) -> Start:
    """Load the newest complete checkpoint when resuming (none found: step 0, said in the log); else start at step 0
    from ``init_from``'s weights, if given. Seed the random streams wherever the checkpoint's could not be restored
    rank by rank (a fresh run, another layout)."""
    folder = latest_checkpoint(run_dir, engine.checkpoint_format) if resume else None
    if resume and folder is None:
        files.log("--resume given but no complete checkpoint found: starting from step 0")
    if folder is None:
        engine.seed(0)
        source = init_source(spec)
        if source is None:
            return Start()
        manifest = engine.load_weights(source)
        saved = f"run {manifest.run!r}'s step {manifest.step}" if manifest.run else f"step {manifest.step}"
        files.log(f"started from the weights of {source} ({saved}, format {manifest.format}); a fresh optimizer")
        return Start(started_from=source)
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
        source = init_source(spec)
        self.manifest = CheckpointManifest(step=start.step, format=engine.checkpoint_format,
                                           tokens_seen=start.tokens_seen, model=spec.model.to_dict(),
                                           plan=spec.plan.to_dict(), world_size=spec.plan.world_size,
                                           tokenizer=str(tokenizer), seed=spec.seed, run=spec.name,
                                           started_from=str(source) if source else None)
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
        seconds = time.perf_counter() - t0
        self.files.event(Event.CHECKPOINT_SAVED, step=step, path=str(folder.relative_to(self.run_dir)),
                         tokens_seen=tokens_seen, seconds=round(seconds, 3))
        self.files.log(f"checkpoint step {step} saved in {seconds:.2f} s")
