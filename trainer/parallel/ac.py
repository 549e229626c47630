"""Activation checkpointing: keep fewer activations in forward, recompute them in backward.

- full: each block keeps only its input (2·s·b·h bytes in 16-bit) and reruns its forward in backward; about one
  extra forward pass (≈ 33 % more compute).
- selective (Korthikanti et al. 2022): recompute only the weight-free part of attention (rotary positions, the
  expansion of shared key/value heads, softmax(q kᵀ) v), whose saved tensors grow with s² in an unfused kernel
  (5·a·s²·b bytes per layer in 16-bit) but whose FLOPs are a small share of the layer's. A fused kernel (flash
  attention, also PyTorch's CPU kernel) already keeps no s² tensors, so there selective saves little more than
  the rotary and grouped-query copies: measured, not assumed (python -m bench.trainer, section 3).

How: the model has no hooks for this. ``apply_ac`` replaces, on each instance, the method whose work is to be
recomputed (a block's ``forward``; attention's ``attend``) by the same method run under a checkpoint function. The
module tree and every parameter name stay as they are, so checkpoints and the other apply_… steps see the same model;
FSDP2, applied afterwards, hooks around the recomputing forward as torchtitan's checkpoint wrapper is hooked.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.model import GPT

# A checkpoint function: wrap(fn, *tensors) runs fn(*tensors) keeping only what it needs to run it again in backward.
Wrap = Callable[..., torch.Tensor]
# Non-reentrant checkpointing: works with keyword arguments, DTensors and inputs that need no grad.
recompute: Wrap = partial(checkpoint, use_reentrant=False)


def _recomputed(module: nn.Module, method: str, wrap: Wrap) -> None:
    inner = getattr(module, method)  # the bound method of the module's class
    setattr(module, method, partial(wrap, inner))


def apply_ac(model: GPT, mode: str, block_wrap: Wrap = recompute, core_wrap: Wrap = recompute) -> None:
    """full: ``block_wrap`` around each block's forward; selective: ``core_wrap`` around attention's weight-free
    core. Each engine passes its own checkpoint functions; the modes mean the same in both."""
    if mode == "full":
        for block in model.layers.values():
            _recomputed(block, "forward", block_wrap)
    elif mode == "selective":
        for block in model.layers.values():
            _recomputed(block.attn, "attend", core_wrap)
    elif mode != "none":
        raise ValueError(f"activation_checkpointing={mode!r}: expected none, selective or full")
