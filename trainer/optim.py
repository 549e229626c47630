"""AdamW, the learning-rate schedule and dynamic loss scaling for fp16."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.contract import OptimizerSpec


def build_optimizer(module: nn.Module, spec: OptimizerSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings only: decaying biases and LayerNorm gains toward 0
    fights the normalisation rather than regularising (GPT-2/3 practice)."""
    params = list({id(p): p for p in module.parameters() if p.requires_grad}.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    kinds = {isinstance(p, DTensor) for p in params}
    # The fused multi-tensor path cannot mix DTensors and plain tensors in one call.
    foreach = None if len(kinds) == 1 else False
    return torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.eps, foreach=foreach)


def lr_at(step: int, spec: OptimizerSpec, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup from lr/warmup to lr over warmup_steps,
    then cosine, linear or constant from lr down to min_lr at the last step."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    if spec.schedule == "constant":
        return spec.lr
    span = max(total_steps - spec.warmup_steps - 1, 1)
    progress = min((step - spec.warmup_steps) / span, 1.0)
    if spec.schedule == "linear":
        return spec.lr - (spec.lr - spec.min_lr) * progress
    return spec.min_lr + 0.5 * (spec.lr - spec.min_lr) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizers: list[torch.optim.Optimizer], lr: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = lr


class LossScaler:
    """Dynamic loss scaling for fp16 (Micikevicius et al. 2018): multiply the loss by S so small gradients do not
    underflow fp16; divide the gradients by S before the update. An overflow anywhere (checked across all ranks)
    skips the step and halves S; ``growth_interval`` clean steps in a row double it. Disabled (S = 1) otherwise."""

    def __init__(self, enabled: bool, init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0

    def unscale_and_check(self, params: list[nn.Parameter], device: torch.device) -> bool:
        """Divide gradients by S; True if every gradient on every rank is finite."""
        if not self.enabled:
            return True
        found_inf = torch.zeros((), device=device)
        inv_scale = torch.full((), 1.0 / self.scale, device=device)
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params if p.grad is not None]
        if grads:
            # The fused op GradScaler uses: multiply by 1/S and flag any inf/nan, without a sync per tensor.
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
        return not bool(found_inf.item())

    def update(self, finite: bool) -> None:
        if not self.enabled:
            return
        if not finite:
            self.scale /= 2.0
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.scale *= 2.0

    def state_dict(self) -> dict:
        return {"enabled": self.enabled, "scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        if self.enabled and state.get("enabled"):
            self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
