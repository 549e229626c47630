"""Activation checkpointing: keep fewer activations in forward, recompute them in backward.

- full: each block keeps only its input (2·s·b·h bytes in 16-bit) and reruns its forward in backward; about one
  extra forward pass (≈ 33 % more compute).
- selective (Korthikanti et al. 2022): recompute only the weight-free part of attention (rotary positions, the
  expansion of shared key/value heads, softmax(q kᵀ) v), whose saved tensors grow with s² in an unfused kernel
  (5·a·s²·b bytes per layer in 16-bit) but whose FLOPs are a small share of the layer's. A fused kernel (flash
  attention, also PyTorch's CPU kernel) already keeps no s² tensors, so there selective saves little more than
  the rotary and grouped-query copies: measured, not assumed (trainer.bench).
"""
from __future__ import annotations

from functools import partial

from torch.utils.checkpoint import checkpoint

from trainer.model import GPT

# Non-reentrant checkpointing: works with keyword arguments, DTensors and inputs that need no grad.
recompute = partial(checkpoint, use_reentrant=False)


def apply_ac(model: GPT, mode: str, block_wrap=recompute, core_wrap=recompute) -> None:
    """full: ``block_wrap`` around each block; selective: ``core_wrap`` around attention's weight-free core.
    Each engine passes its own checkpoint functions; the modes mean the same in both."""
    if mode == "full":
        model.wrap_block = block_wrap
    elif mode == "selective":
        for block in model.layers.values():
            block.attn.wrap_core = core_wrap
    elif mode != "none":
        raise ValueError(f"activation_checkpointing={mode!r}: expected none, selective or full")
