"""Model-state bytes this rank holds under a DeepSpeed engine, measured on its tensors (as trainer.memory does for
the native engine), so that the planner's ZeRO formulas (REFERENCE.md: 16Ψ, 4Ψ + 12Ψ/N_d, …) can be checked.

params: the module's parameters as this rank holds them (ZeRO-3: its partition ``ds_tensor``; otherwise whole).
optimizer: the tensors of the wrapped AdamW's state (ZeRO ≥ 1: moments of this rank's fp32 partition) plus any
fp32 master partition ZeRO keeps beside 16-bit weights. grads: the gradient partitions ZeRO keeps between steps
(stage ≥ 2) or the parameters' .grad (stages 0–1), read before they are freed is not possible from outside the
engine, so they are counted from the partition sizes: Ψ/N_d elements at stage ≥ 2, Ψ otherwise.
"""
from __future__ import annotations

import torch

from trainer.memory import _tensor_bytes


def engine_state_bytes(engine) -> dict[str, int]:
    module, opt = engine.module, engine.optimizer
    params = [getattr(p, "ds_tensor", p) for p in module.parameters()]
    params_bytes = _tensor_bytes(params)
    base = getattr(opt, "optimizer", opt)
    state = [v for s in base.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    masters = []
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        masters += [t for t in getattr(opt, name, []) or [] if isinstance(t, torch.Tensor)]
    # In fp32 the master partition may be the very storage of the weights (counted once by storage).
    optimizer_bytes = _tensor_bytes(state + masters)
    stage = engine.zero_optimization_stage()
    world = engine.dp_world_size if hasattr(engine, "dp_world_size") else 1
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in {id(p): p for p in module.parameters()}.values())
    grad_elems = -(-numel // world) if stage >= 2 else numel
    grad_size = torch.finfo(torch.float32).bits // 8 if engine.bfloat16_enabled() is False else 2
    return {"params_bytes": params_bytes, "grads_bytes": grad_elems * grad_size, "optimizer_bytes": optimizer_bytes}
