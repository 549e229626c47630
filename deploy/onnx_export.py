"""A GPT's whole forward as one ONNX graph: token ids (B, T) int64 → logits (B, T, V) fp32, B and T dynamic.

    export_onnx(model, Path("model.onnx"))      # the graph, weights inside the file below 2 GiB
    check_onnx(model, path, ids)                # max |logits_onnxruntime − logits_torch|

Exporter: ``torch.onnx.export(..., dynamo=True)`` (torch.export, then onnxscript). The TorchScript exporter
(``dynamo=False``) also exports the dense models (given the attention below), in a fraction of a second, but not
a mixture of experts: it records Python integers computed from shapes as constants of the traced shape (an MoE
layer's capacity ⌈factor · B·T · k / E⌉ is frozen), and it exports the index_add that gathers the experts'
outputs, whose indices repeat, wrongly (logits off by ~0.1 even at the traced shape). torch.export keeps shapes
symbolic and exports every model here right at every (B, T); it costs a few seconds per export (~4 s for the tiny
preset on two cores).

Causal attention: ``Attention.attend`` decides whether to mask from the shapes (one query over a cache needs no
mask), a Python bool in eager mode but a symbolic one under export, which ``scaled_dot_product_attention``
refuses. The exported forward never has a cache, and over a whole sequence the mask is always causal (a
one-token sequence too: its only key is its own), so for the export each attention is given an ``attend`` that
says so; the weights, rotary tables and head grouping are the model's own.

The sequence axis is bounded by the model's seq_len: learned positions and rotary tables hold that many positions.
"""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import onnxruntime
import torch
import torch.nn.functional as F

from trainer.model import GPT, Attention

INPUT_NAME, OUTPUT_NAME = "input_ids", "logits"
OPSET = 18
# A protobuf message (an .onnx file with its weights inside) cannot exceed 2 GiB; larger models keep their
# weights in a data file beside it.
SINGLE_FILE_LIMIT_BYTES = 2 ** 31 - 2 ** 24


class WholeSequenceAttention(Attention):
    """Attention over a whole sequence without a cache: causal always, so the mask needs no decision."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int = 0,
               cache=None) -> torch.Tensor:
        if self.rotary is not None:
            q, k = self.rotary(q, start), self.rotary(k, start)
        if self.group > 1:
            k = k.repeat_interleave(self.group, dim=1)
            v = v.repeat_interleave(self.group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@contextmanager
def _exportable(model: GPT) -> Iterator[GPT]:
    """The model in eval mode with whole-sequence attention, put back as it was afterwards."""
    attentions = [m for m in model.modules() if type(m) is Attention]
    was_training = model.training
    model.eval()
    for attention in attentions:
        attention.__class__ = WholeSequenceAttention
    try:
        yield model
    finally:
        for attention in attentions:
            attention.__class__ = Attention
        model.train(was_training)


def _weight_bytes(model: GPT) -> int:
    distinct = {id(p): p for p in model.parameters()}
    return sum(p.numel() * p.element_size() for p in distinct.values())


def export_onnx(model: GPT, path: Path, seq_len: int | None = None) -> Path:
    """Write ``model``'s forward to ``path`` (opset 18) with dynamic batch and sequence axes; the graph takes
    sequences of 1 … ``seq_len`` tokens (default and at most the model's seq_len). Returns ``path``."""
    longest = model.spec.seq_len if seq_len is None else seq_len
    if not 2 <= longest <= model.spec.seq_len:
        raise ValueError(f"seq_len={longest}: the exported graph takes sequences of 2 to the model's "
                         f"seq_len={model.spec.seq_len} tokens")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    # an example of two sequences of more than one token: the exporter treats sizes 0 and 1 as special cases
    example = torch.zeros((2, min(longest, 8)), dtype=torch.int64, device=device)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=longest)
    with _exportable(model):
        torch.onnx.export(model, (example,), str(path), dynamo=True, opset_version=OPSET,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_shapes=({0: batch, 1: sequence},),
                          external_data=_weight_bytes(model) >= SINGLE_FILE_LIMIT_BYTES, verbose=False)
    return path


def onnx_logits(path: Path, ids: np.ndarray | torch.Tensor) -> np.ndarray:
    """The exported graph's logits for ``ids`` (B, T), run by onnxruntime on the CPU."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = torch.as_tensor(ids, dtype=torch.int64).cpu().numpy()
    return session.run([OUTPUT_NAME], {INPUT_NAME: feed})[0]


def check_onnx(model: GPT, path: Path, ids: np.ndarray | torch.Tensor) -> float:
    """max |logits of the ONNX graph at ``path`` − logits of ``model``| over ``ids`` (B, T), the model in eval mode
    (its own mode restored afterwards)."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = model(ids.to(next(model.parameters()).device)).float().cpu().numpy()
    finally:
        model.train(was_training)
    return float(np.abs(onnx_logits(path, ids) - expected).max())


def add_arguments(parser) -> None:
    parser.add_argument("--checkpoint", required=True, help="a checkpoints/step-<n> folder (any plan, any engine)")
    parser.add_argument("--output", required=True, help="the .onnx file to write")


def run(args) -> int:
    """A checkpoint's forward → an ONNX graph (the input of TensorRT), checked against PyTorch with onnxruntime."""
    from trainer.generate import load_model_from_checkpoint

    try:
        model, _ = load_model_from_checkpoint(args.checkpoint)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = export_onnx(model, Path(args.output))
    ids = torch.randint(0, model.spec.vocab_size, (2, min(16, model.spec.seq_len)),
                        generator=torch.Generator().manual_seed(0))
    print(json.dumps({"path": str(path), "bytes": path.stat().st_size,
                      "max_abs_difference": check_onnx(model, path, ids)}))
    return 0
