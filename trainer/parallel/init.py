"""Initial weights of a sharded or split model: each rank fills only the shards it holds of the full tensors the
model names (``GPT.initial_tensors``), so every plan starts from the very weights one process would."""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.model import GPT


@torch.no_grad()
def init_sharded_weights(model: GPT, seed: int) -> None:
    for p, full in model.initial_tensors(seed):
        if isinstance(p, DTensor):
            # src_data_rank=None: every rank cuts its own shard from its own copy, no communication
            local = distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(local.to_local())
        else:
            p.copy_(full)
    model.reset_buffers()
