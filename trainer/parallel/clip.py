"""The global gradient norm over every shard, replica and pipeline stage, and clipping to it.

‖g‖² = Σ over distinct gradient elements g_i². Each rank sums the squares of its local pieces and divides by how
many ranks hold the same piece (its replication count), so that one all-reduce (sum) over the whole world counts
every element exactly once:
- a plain tensor (DDP, or a weight not split by tensor parallel) is held by all dp·tp ranks of its stage;
- a DTensor on mesh M is held by the dp·tp/|M| ranks outside M times the size of each Replicate dimension of M
  (Shard dimensions split it; FSDP's dp dimension and tensor parallel's splits are Shard).
Pipeline stages hold different layers, so stages simply add.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate


def _replicas(grad: torch.Tensor, dp_tp: int) -> int:
    if not isinstance(grad, DTensor):
        return dp_tp
    mesh = grad.device_mesh
    count = dp_tp // mesh.size()
    for dim, placement in enumerate(grad.placements):
        if isinstance(placement, Replicate):
            count *= mesh.size(dim)
    return count


def global_grad_norm(params: list[nn.Parameter], dp_tp: int, device: torch.device) -> torch.Tensor:
    """‖g‖₂ over the whole model, the same value on every rank (fp32)."""
    by_replicas: dict[int, list[torch.Tensor]] = {}
    for p in params:
        if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements):
            # sequence parallel leaves a norm's gain with per-rank partial sums of its gradient: the square of a sum
            # is not the sum of squares, so they are added up (into the weight's own layout) before they count
            p.grad = p.grad.redistribute(p.grad.device_mesh, p.placements)
        if p.grad is not None:
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            if local.numel():
                by_replicas.setdefault(_replicas(p.grad, dp_tp), []).append(local)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for replicas, grads in by_replicas.items():
        # one fused kernel per group of tensors instead of one per parameter
        norms = torch._foreach_norm(grads, 2.0)
        total += torch.stack(norms).double().pow(2).sum() / replicas
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return total.sqrt().float()


def clip_grads_(params: list[nn.Parameter], max_norm: float, norm: torch.Tensor) -> None:
    """Scale every gradient by max_norm/‖g‖ when ‖g‖ > max_norm (0 disables clipping)."""
    if max_norm <= 0:
        return
    coef = max_norm / (float(norm) + 1e-6)
    if coef >= 1.0 or not math.isfinite(coef):
        return
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params if p.grad is not None]
    torch._foreach_mul_(grads, coef)
