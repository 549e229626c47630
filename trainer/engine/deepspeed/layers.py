"""The native GPT adapted to DeepSpeed: its activation checkpointing, its MoE layer, its optimizer groups.

MoE: each native ``trainer.model.moe.MoE`` becomes ``DeepSpeedMoE`` around ``deepspeed.moe.layer.MoE`` with the same
router weight and the same experts (this rank's E/ep of them, copied from the seeded native model; GELU or SwiGLU
MLPs of width moe_ffn, DeepSpeed runs whatever module it is given), so both engines start from one model. A shared
expert (and its sigmoid gate) is the native layer's own module, run beside DeepSpeed's layer on every token and
added to its output; it is dense, so DeepSpeed averages its gradients over all of dp, and its names stay the native
ones. DeepSpeed's gate has its own conventions: capacity ⌈capacity_factor · N / E⌉ per expert for top-1 and twice
that for top-2 (at least ``min_capacity``), and aux = E · Σ_e f_e · P_e for top-1 (E² · mean for top-2, the same
number); capacity_factor 0 (drop nothing) is its drop_tokens=False, whose capacity is the largest expert's load. It
renormalises the chosen experts' weights exactly when top_k > 1 (the contract refuses other topk_norm choices for
this engine). Random token selection and sampled second experts are turned off: routing is then a function of the
weights alone, as in the native layer. DeepSpeed reports tokens per expert counting first choices only; the dropped
fraction is estimated from them as Σ_e max(0, count_e − cap) / N.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist
from deepspeed.moe.layer import MoE
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint, non_reentrant_checkpoint
from torch import nn

from trainer.contract import RunSpec
from trainer.model import GPT, MLP
from trainer.model.moe import MoE as NativeMoE
from trainer.parallel.ac import apply_ac


class DeepSpeedMoE(nn.Module):
    """(B, T, C) → (B, T, C) through deepspeed.moe; keeps the aux loss and counts of its last forward."""

    def __init__(self, native: NativeMoE, spec: RunSpec):
        super().__init__()
        m, ep = spec.model, spec.plan.ep
        self.n_experts, self.top_k, self.capacity_factor = m.n_experts, m.top_k, m.capacity_factor
        drops = m.capacity_factor > 0
        factor = m.capacity_factor if drops else 1.0  # not read without dropping
        self.moe = MoE(hidden_size=m.d_model, expert=MLP(m, m.moe_ffn), num_experts=m.n_experts, ep_size=ep,
                       k=m.top_k, capacity_factor=factor, eval_capacity_factor=factor, min_capacity=1,
                       drop_tokens=drops, use_rts=False, top2_2nd_expert_sampling=False)
        # the native modules themselves: weights and names unchanged
        self.shared, self.shared_gate = native.shared, native.shared_gate
        self.aux: Optional[torch.Tensor] = None
        self.counts: Optional[torch.Tensor] = None
        self.tokens = 0
        self._copy_from(native)

    def _copy_from(self, native: NativeMoE) -> None:
        """Router → gate.wg; global expert ep_rank·E/ep + i → local expert i (DeepSpeed's expert groups are set
        up by deepspeed.initialize, so the rank is read from the data-parallel rank: ep is innermost)."""
        inner = self.moe.deepspeed_moe
        per = self.moe.num_local_experts
        ep_rank = (dist.get_rank() % self.moe.ep_size) if dist.is_initialized() else 0
        with torch.no_grad():
            inner.gate.wg.weight.copy_(native.router.weight)
            for i, expert in enumerate(inner.experts.deepspeed_experts):
                expert.load_state_dict(native.experts[str(ep_rank * per + i)].state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, aux, counts = self.moe(x)
        self.aux, self.counts, self.tokens = aux, counts.detach(), x.shape[0] * x.shape[1]
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared  # (B, T, 1) per-token scale
            out = out + shared.to(out.dtype)
        return out

    def capacity(self) -> int:
        """Slots per expert of the last forward (every token's, when nothing is dropped)."""
        if self.capacity_factor == 0:
            return self.tokens * self.top_k
        return max(1, math.ceil(self.capacity_factor * self.tokens / self.n_experts)) * self.top_k


def apply_deepspeed_moe(model: GPT, spec: RunSpec) -> None:
    for block in model.layers.values():
        if isinstance(block.mlp, NativeMoE):
            block.mlp = DeepSpeedMoE(block.mlp, spec)


def _layers(module: nn.Module) -> list[DeepSpeedMoE]:
    return [m for m in module.modules() if isinstance(m, DeepSpeedMoE)]


def aux_loss(module: nn.Module) -> Optional[torch.Tensor]:
    layers = _layers(module)
    return torch.stack([m.aux for m in layers]).sum() if layers else None


def routing_stats(module: nn.Module, acc: Optional[dict]) -> Optional[dict]:
    """Accumulate per-layer counts in the form trainer.parallel.expert.routing_metrics reads."""
    layers = _layers(module)
    if not layers:
        return None
    acc = acc or {"aux": 0.0, "micro": 0, "load": [torch.zeros(m.n_experts, dtype=torch.long) for m in layers],
                  "dropped": torch.zeros(len(layers), dtype=torch.long), "assignments": 0}
    acc["aux"] += float(sum(float(m.aux.detach()) for m in layers))
    acc["micro"] += 1
    for i, m in enumerate(layers):
        counts = m.counts.to("cpu", torch.long)
        acc["load"][i] = acc["load"][i] + counts
        acc["dropped"][i] += int((counts - m.capacity()).clamp(min=0).sum())
    acc["assignments"] += layers[0].tokens
    return acc


def optimizer_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The native groups (decay on matrices and embeddings only); expert weights in groups of their own, as
    DeepSpeed's ZeRO needs for MoE (they are reduced over the expert-data-parallel group, not all of dp)."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay, "name": "decay"},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "name": "no_decay"}]
    if _layers(model):
        groups = split_params_into_different_moe_groups_for_optimizer(groups)
    return groups


def _block_checkpoint(forward, x):
    """``forward`` is a block's own bound forward (trainer.parallel.ac)."""
    if isinstance(getattr(forward.__self__, "mlp", None), DeepSpeedMoE):
        # Reentrant recompute runs the first forward without autograd: the aux loss a MoE block leaves beside its
        # output would carry no gradient to the router (measured: losses drift 1.9e-4 from the native run).
        return non_reentrant_checkpoint(forward, x)
    return checkpoint(forward, x)


def _core_checkpoint(fn, *tensors):
    return checkpoint(fn, *tensors)


def apply_deepspeed_ac(model: GPT, mode: str) -> None:
    """full: deepspeed.checkpointing around each block (keeps its input, partitioned when configured);
    selective: around the weight-free core of attention, as the native engine's selective mode."""
    apply_ac(model, mode, block_wrap=_block_checkpoint, core_wrap=_core_checkpoint)
