"""A checkpoint made ready to serve, whatever the entry it is written as: read once, reduced once, measured once.

    prepared = prepare(checkpoint, PrepareOptions(reduction="int8", tensor_parallel=2))
    deploy.export.write_entry(prepared, repository, options)      # one writer: a Triton model-repository entry

``prepare`` does every step that reads the checkpoint or computes on its weights, each exactly once, in order:

    manifest   read once (trainer.contract.manifest): the model spec, the tokenizer, where the weights lie
    weights    loaded once, whole, from either engine's format (trainer.checkpoint.consolidated)
    reduce     once, to the asked reduction (deploy.reduce)
    measure    what the reduction cost (deploy.quality) and the checkpoint's own greedy tokens for a prompt, which a
               deployment's smoke check compares with what the server answers; both on one model of the reduced
               weights, computed as a server computes it (``as_served``: experts drop no token)
    shard      the reduced weights split into tensor-parallel ranks (deploy.reshard)

and returns a ``PreparedExport`` holding all of it. A writer only writes it out: it reads no checkpoint and reduces
nothing, so the same prepared object can be written as more than one kind of entry.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deploy.quality import model_with, reduction_report, validation_tokens_for
from deploy.reduce import REDUCTIONS, dequantize_state, reduce_state
from deploy.reshard import shard_problems, shard_state
from deploy.serving.layout import Codec
from trainer.checkpoint.consolidated import checkpoint_state
from trainer.contract import ModelSpec
from trainer.contract.manifest import CheckpointManifest, read_manifest
from trainer.generate import generate

SMOKE_PROMPT, SMOKE_TOKENS = "\n", 16


class ExportError(ValueError):
    """The export was refused; the message says what to change."""


@dataclass(frozen=True)
class PrepareOptions:
    reduction: str = "none"
    tensor_parallel: int = 1     # ranks the weights are split over (1: one whole shard)
    measure: bool = True         # validation perplexity of the reduced weights against fp32

    def problems(self) -> list[str]:
        if self.reduction not in REDUCTIONS:
            return [f"reduction {self.reduction!r}: choose one of {', '.join(REDUCTIONS)}"]
        return []


@dataclass(frozen=True)
class PreparedExport:
    """A checkpoint's weights reduced, measured and split: all that any entry writer needs."""

    checkpoint: Path
    manifest: CheckpointManifest
    spec: ModelSpec
    options: PrepareOptions
    weights: dict[str, torch.Tensor]               # the reduced whole state, native names
    shards: tuple[dict[str, torch.Tensor], ...]    # ``weights`` split rank by rank (deploy.reshard)
    quality: dict[str, Any]                        # deploy.quality.reduction_report
    smoke: dict[str, Any]                          # prompt, max_tokens, token_ids, text: the greedy reference
    seconds: float                                 # spent preparing

    @property
    def tokenizer(self) -> Path:
        return Path(self.manifest.tokenizer)


def _checkpoint_problems(checkpoint: Path, manifest: CheckpointManifest | None, tensor_parallel: int) -> list[str]:
    if manifest is None:
        return [f"{checkpoint} has no manifest.json: not a complete checkpoint"]
    if not manifest.tokenizer or not Path(manifest.tokenizer).is_file():
        return [f"the checkpoint's tokenizer ({manifest.tokenizer or 'none recorded'}) is missing: a served model "
                "takes and returns text; import or prepare the dataset's tokenizer again"]
    return shard_problems(manifest.model_spec(), tensor_parallel)


def as_served(spec: ModelSpec) -> ModelSpec:
    """The spec of the model a server computes: its mixture-of-experts layers compute every chosen expert of every
    token (capacity_factor 0), whatever capacity bounded the training batches. A model trained with capacity 0
    (Mixtral's and Qwen2-MoE's way) is served as it is; one trained with a capacity may drop tokens in the
    trainer's forward of a long prompt, where a server does not."""
    return spec.replace(capacity_factor=0.0) if spec.is_moe else spec


def smoke_reference(model, tokenizer: Path) -> dict[str, Any]:
    """The model's greedy continuation of SMOKE_PROMPT: what a served copy of the same weights must answer."""
    codec = Codec(tokenizer)
    prompt_ids = codec.encode(SMOKE_PROMPT)
    token_ids = generate(model, prompt_ids, SMOKE_TOKENS, temperature=0)[len(prompt_ids):]
    return {"prompt": SMOKE_PROMPT, "max_tokens": SMOKE_TOKENS, "token_ids": token_ids,
            "text": codec.decode(token_ids)}


def prepare(checkpoint: str | Path, options: PrepareOptions) -> PreparedExport:
    """Read, reduce, measure and split ``checkpoint`` (module docstring); ExportError before any weight is read
    when the options or the checkpoint cannot be exported."""
    checkpoint = Path(checkpoint)
    manifest = read_manifest(checkpoint)
    problems = options.problems() + _checkpoint_problems(checkpoint, manifest, options.tensor_parallel)
    if problems:
        raise ExportError("; ".join(problems))
    started = time.perf_counter()
    spec = manifest.model_spec()
    state = checkpoint_state(checkpoint, manifest)
    reduced = reduce_state(state, options.reduction)
    # the model a server computes (up to its arithmetic precision): the smoke check's reference, and measured
    # unless it differs from the trained one by more than the reduction (a capacity: the report is the reduction's)
    served_spec = as_served(spec)
    served = model_with(dequantize_state(reduced), served_spec)
    val_tokens = validation_tokens_for(manifest) if options.measure else None
    quality = reduction_report(state, reduced, options.reduction, spec, val_tokens,
                               reduced_model=served if served_spec == spec else None)
    smoke = smoke_reference(served, Path(manifest.tokenizer))
    shards = tuple(shard_state(reduced, spec, options.tensor_parallel))
    return PreparedExport(checkpoint=checkpoint, manifest=manifest, spec=spec, options=options, weights=reduced,
                          shards=shards, quality=quality, smoke=smoke, seconds=time.perf_counter() - started)
