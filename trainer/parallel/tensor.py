"""Tensor parallel (Megatron-LM, Shoeybi et al. 2019) and sequence parallel (Korthikanti et al. 2022) via DTensor.

Within one block, with t ranks in the tensor-parallel group:
- Column split, Y = X A with A = [A_1 … A_t] split by columns: rank i computes Y_i = X A_i. No communication in
  forward; backward all-reduces dL/dX (the input was replicated). Used for q, k, v (whole heads per rank: H/t query
  heads, K/t key/value heads; Qwen2's q/k/v biases split with their rows) and for the MLP's up projection, and
  SwiGLU's gate beside it (the same F/t hidden units in both; GELU and SiLU(gate) ⊙ up are elementwise, so they
  apply to each rank's columns alone).
- Row split, Z = Y B with B = [B_1; …; B_t] split by rows: rank i holds Y_i and computes Y_i B_i, a partial sum;
  Z = Σ_i Y_i B_i is one all-reduce in forward. Used for the attention output and the MLP's down projection.
  Hence 2 all-reduces forward and 2 backward per block.
- Sequence parallel: LayerNorm, RMSNorm and dropout work on each position alone, so they run on T/t positions per
  rank (SequenceParallel replicates either norm's parameters and sums their gradients over the partners); the
  all-reduce after a row split becomes a reduce-scatter (to T/t positions) and the input to a column split an
  all-gather: the same bytes moved, but activations outside attention and the MLP shrink t times.
- Vocabulary: the embedding table is split by rows (V/t tokens per rank; a token outside a rank's range looks up 0,
  and the partial lookups are summed). The LM head is a column split of the same table (tied weights stay one
  tensor); with ``loss_parallel`` the logits stay split over the vocabulary and the cross-entropy is computed from
  per-rank max and sum-exp, never gathering the T × V logits.
- Dropout: tensor-parallel partners start every step from the same random state, so a dropout on an activation they
  share (the residual stream without sequence parallel, the embedding) draws one mask on all of them, as one process
  would. A dropout on what each rank holds alone — its H/t heads' attention probabilities, and with sequence parallel
  its T/t positions of the stream — must differ between ranks, or head h and head h + H/t (position i and i + T/t)
  would be dropped together. ``apply_tp`` runs those from a stream of the rank's own (Megatron-LM's model-parallel
  RNG tracker does the same), derived from one draw of the shared stream, so recomputation redraws the same masks.
"""
from __future__ import annotations

from functools import wraps
from typing import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch import nn
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                               PrepareModuleOutput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from trainer.model import GPT
from trainer.model.moe import MoE


def _own_stream(fn: Callable, tp_rank: int) -> Callable:
    """``fn`` run from this tensor-parallel rank's own random stream: one number drawn from the shared stream (the
    same on every partner, and the same again when a checkpoint recomputes), mixed with the rank, seeds it."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []

    @wraps(fn)
    def run(*args, **kwargs):
        shared = int(torch.randint(0, 2 ** 62, (1,)).item())
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(hash((shared, tp_rank)) % (2 ** 63))
            return fn(*args, **kwargs)
    return run


def _rank_local_dropout(model: GPT, tp_rank: int, sequence_parallel: bool) -> None:
    for block in model.layers.values():
        block.attn.attend = _own_stream(block.attn.attend, tp_rank)
        if sequence_parallel:  # the stream between blocks holds this rank's positions only
            block.attn.resid_drop.forward = _own_stream(block.attn.resid_drop.forward, tp_rank)
            if not isinstance(block.mlp, MoE):  # experts' outputs are whole on every rank: one shared mask
                block.mlp.drop.forward = _own_stream(block.mlp.drop.forward, tp_rank)


def _mlp_plan(mlp: nn.Module, path: str, output) -> dict:
    """An MLP's column splits (up, and SwiGLU's gate: the product of the two is elementwise, so each rank's F/t
    hidden units need only its own columns of both) and its row split, whose partial sums become ``output``."""
    plan = {f"{path}.up": ColwiseParallel(), f"{path}.down": RowwiseParallel(output_layouts=output)}
    if getattr(mlp, "gate", None) is not None:
        plan[f"{path}.gate"] = ColwiseParallel()
    return plan


def _moe_plan(moe: MoE, sp: bool) -> dict:
    """A mixture-of-experts layer (Megatron-LM's tensor-parallel experts): the router is replicated, so every
    tensor-parallel partner routes the same tokens to the same slots; each routed expert and the shared expert is
    split like the dense MLP over its own width (moe_ffn/t, shared_expert_ffn/t hidden units a rank), its output
    all-reduced whole, so the gate weights, the combine and the shared expert's sigmoid gate (replicated) see the
    same values as one process. With sequence parallel the layer takes the all-gathered sequence and keeps its
    T/t positions of the result (no communication back: every rank holds the whole output)."""
    plan: dict = {}
    for e, expert in moe.experts.items():
        plan.update(_mlp_plan(expert, f"mlp.experts.{e}", Replicate()))
    if moe.shared is not None:
        plan.update(_mlp_plan(moe.shared, "mlp.shared", Replicate()))
    if sp:
        plan["mlp"] = PrepareModuleInputOutput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                               use_local_input=True, output_layouts=(Replicate(),),
                                               desired_output_layouts=(Shard(1),), use_local_output=True)
    return plan


def apply_tp(model: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Shard ``model`` (a whole model or one pipeline stage) in place over ``tp_mesh``.

    Between blocks the residual stream is a plain local tensor: (B, T, C) replicated, or (B, T/t, C) with sequence
    parallel. Pipeline stages therefore send plain tensors, a t-th of the sequence with sequence parallel.
    """
    sp = sequence_parallel
    stream = Shard(1) if sp else Replicate()  # layout of the residual stream between blocks
    top: dict = {}
    if model.embed is not None:
        top["embed.tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sp:  # positions were added to the full sequence; keep this rank's T/t of it (no communication)
            top["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                               use_local_output=True)
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel(use_local_output=True)
    if model.head is not None:
        top["head"] = ColwiseParallel(input_layouts=stream,
                                      output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                      use_local_output=not loss_parallel)
    if top:
        parallelize_module(model, tp_mesh, top)
    if model.spec.tied_embeddings and model.embed is not None and model.head is not None:
        # Both tables are now V/t rows per rank (Shard(0)); make them one parameter again.
        model.head.weight = model.embed.tokens.weight

    for block in model.layers.values():
        plan: dict = {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.out": RowwiseParallel(output_layouts=stream),
        }
        plan.update(_moe_plan(block.mlp, sp) if isinstance(block.mlp, MoE) else _mlp_plan(block.mlp, "mlp", stream))
        if sp:
            plan.update({
                "ln1": SequenceParallel(use_local_output=True),
                "ln2": SequenceParallel(use_local_output=True),
                # all-gather the T/t positions before the column splits
                "attn": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None),
                                           use_local_output=True),
            })
            if not isinstance(block.mlp, MoE):
                plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                 use_local_output=True)
        parallelize_module(block, tp_mesh, plan)
    if model.spec.dropout > 0:
        _rank_local_dropout(model, tp_mesh.get_local_rank(), sp)
