"""Data parallel: each of the dp ranks runs its share of the global batch; gradients are averaged over dp.

- zero_stage 0: every rank keeps full weights, gradients and optimizer state. DDP all-reduces gradients in buckets
  while backward is still running (overlap). DDP does not take DTensor parameters (tensor parallel), and its
  bucket bookkeeping breaks when a pipeline runs several forwards before the first backward, so in those cases
  the same average is done by ``ReplicatedGradSync`` after backward: one all-reduce of all local gradient shards,
  flattened, over the dp group.
- zero_stage 3 (FSDP2, ``fully_shard``): each parameter is split into dp pieces (Shard(0) DTensors); a block's
  weights are all-gathered just before its forward and backward and dropped after; gradients are reduce-scattered
  so each rank keeps and updates only its piece: model state 16Ψ/dp bytes instead of 16Ψ (docs/formulas.md).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from trainer.model import GPT


def apply_ddp(model: nn.Module, dp_group, device: torch.device) -> DistributedDataParallel:
    return DistributedDataParallel(model, process_group=dp_group,
                                   device_ids=[device.index] if device.type == "cuda" else None,
                                   broadcast_buffers=False)  # no buffers need syncing (rotary tables are derived)


def apply_fsdp(model: GPT, dp_mesh: DeviceMesh, param_dtype: torch.dtype, reshard_after_forward: bool) -> None:
    """Shard each block as its own unit (gathered one at a time), then the rest (embedding, final norm, head) at
    the root. Reductions stay in fp32 under bf16 so that averaging over many ranks does not lose bits."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)


def average_gradients(grads: list[torch.Tensor], group, divide: int) -> None:
    """Sum ``grads`` over ``group`` in one all-reduce of their flattened concatenation, then divide."""
    if not grads:
        return
    flat = torch.cat([_local(g).reshape(-1) for g in grads])
    if dist.get_world_size(group) > 1:
        dist.all_reduce(flat, group=group)
    flat /= divide
    offset = 0
    for g in grads:
        g = _local(g)
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


class ReplicatedGradSync:
    """Average the gradients of replicated (non-FSDP) parameters over the dp group after backward."""

    def __init__(self, params: list[nn.Parameter], dp_group, dp: int):
        self.params, self.group, self.dp = params, dp_group, dp

    def __call__(self) -> None:
        if self.dp > 1:
            average_gradients([p.grad for p in self.params if p.grad is not None], self.group, self.dp)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t
