"""What a weight reduction costs: bytes saved, and validation perplexity before and after.

Perplexity is exp of the mean next-token cross-entropy, in nats, over fixed windows of the validation tokens:

    PPL = exp( (1/N) Σ_n −ln p(x_{n+1} | x_≤n) )

so a relative change of PPL is exp(ΔCE) − 1 ≈ ΔCE for small changes: +0.01 nats of loss is about +1 % perplexity.
Every figure is measured on the same windows (``trainer.data.eval_batches`` with one seed), so the figures of two
reductions differ by the weights alone.

A reduced state is evaluated upcast to fp32 (``dequantize_state``) in an fp32 model: this measures what storing the
weights smaller loses, not the extra rounding of running the arithmetic in bf16 or fp16, which depends on the
serving kernels.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy.reduce import dequantize_state, state_bytes
from trainer.checkpoint.consolidated import empty_model
from trainer.contract import ModelSpec
from trainer.contract.manifest import CheckpointManifest
from trainer.data import eval_batches, load_tokens
from trainer.data.prepare import META, VAL
from trainer.model import GPT, loss_fn

EVAL_SEED = 0  # the windows every report measures on


def validation_perplexity(model: GPT, tokens: np.ndarray, seq_len: int, batch_size: int = 8,
                          max_batches: int = 16) -> float:
    """exp(mean cross-entropy) of ``model`` over up to ``max_batches`` batches of ``batch_size`` windows of
    ``seq_len`` + 1 tokens (fewer batches when the tokens hold fewer distinct windows), without gradients, in
    eval mode (no dropout), the loss in fp32. The model's own training mode is restored afterwards."""
    windows = len(tokens) - seq_len
    n_batches = max(1, min(max_batches, windows // batch_size))
    batches = eval_batches(tokens, seq_len, batch_size, n_batches, seed=EVAL_SEED)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            # every batch has batch_size × seq_len targets, so the mean of the batch means is the mean per token
            losses = [float(loss_fn(model(torch.from_numpy(x).to(device)), torch.from_numpy(y).to(device)))
                      for x, y in batches]
    finally:
        model.train(was_training)
    return math.exp(sum(losses) / len(losses))


def model_with(state: dict[str, torch.Tensor], spec: ModelSpec) -> GPT:
    """An fp32 GPT of ``spec`` on the CPU holding ``state`` (native names, fp32), in eval mode."""
    model = empty_model(spec)
    model.load_state_dict(state)
    return model.eval()


def reduction_report(state: dict[str, torch.Tensor], reduced: dict[str, torch.Tensor], reduction: str,
                     spec: ModelSpec, val_tokens: np.ndarray | None,
                     reduced_model: GPT | None = None) -> dict[str, Any]:
    """JSON-able figures of ``reduced``, which is ``state`` under ``reduction``: bytes_fp32, bytes, ratio
    (fp32 / reduced), perplexity_fp32, perplexity (the reduced weights brought back to fp32) and perplexity_change
    (relative: 0.004 = +0.4 %); the perplexity figures are None without validation tokens. ``reduced_model`` is
    the reduced weights already in a model (``model_with(dequantize_state(reduced), spec)``), built here when not
    given."""
    fp32 = dequantize_state(state)  # the weights as trained, in fp32: an upcast, no reduction
    bytes_fp32, bytes_reduced = state_bytes(fp32), state_bytes(reduced)
    report: dict[str, Any] = {"reduction": reduction, "bytes_fp32": bytes_fp32, "bytes": bytes_reduced,
                              "ratio": bytes_fp32 / bytes_reduced,
                              "perplexity_fp32": None, "perplexity": None, "perplexity_change": None}
    if val_tokens is not None:
        if reduced_model is None:
            reduced_model = model_with(dequantize_state(reduced), spec)
        before = validation_perplexity(model_with(fp32, spec), val_tokens, spec.seq_len)
        after = validation_perplexity(reduced_model, val_tokens, spec.seq_len)
        report.update(perplexity_fp32=before, perplexity=after, perplexity_change=after / before - 1.0)
    return report


def validation_tokens_for(manifest: CheckpointManifest) -> np.ndarray | None:
    """The validation tokens of the dataset a checkpoint was trained on: val.bin in the prepared folder that holds
    the tokenizer.json its manifest names (with the meta.json that gives their dtype); None when the checkpoint
    names no tokenizer or that folder no longer holds them."""
    if not manifest.tokenizer:
        return None
    prepared = Path(manifest.tokenizer).parent
    if not (prepared / VAL).is_file() or not (prepared / META).is_file():
        return None
    return load_tokens(prepared / VAL)
