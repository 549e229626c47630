"""Model-state bytes this rank holds under a DeepSpeed engine, so that the planner's ZeRO formulas (docs/formulas.md:
16Ψ, 4Ψ + 12Ψ/N_d, 2Ψ + 14Ψ/N_d, 16Ψ/N_d) can be checked against the engine.

params and optimizer are measured on tensors: the module's parameters as this rank holds them (ZeRO-3: its
partition ``ds_tensor``), and the wrapped AdamW's moments plus the fp32 master partition ZeRO keeps (a separate
copy even in fp32 training, so ZeRO ≥ 1 shows 3 × Ψ/N_d × 4 bytes, not 2). grads are counted, not measured:
ZeRO frees its gradient buffers inside ``engine.step``, out of reach between steps, so this reports the size of
what it holds at the boundary: Ψ/N_d elements at stage ≥ 2, Ψ at stages 0–1.
"""
from __future__ import annotations

import torch

from trainer.profiling.memory import tensor_bytes


def engine_state_bytes(engine) -> dict[str, int]:
    module, opt = engine.module, engine.optimizer
    params = [getattr(p, "ds_tensor", p) for p in module.parameters()]
    params_bytes = tensor_bytes(params)
    base = getattr(opt, "optimizer", opt)
    state = [v for s in base.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    masters = []
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        masters += [t for t in getattr(opt, name, []) or [] if isinstance(t, torch.Tensor)]
    # In fp32 the master partition may be the very storage of the weights (counted once by storage).
    optimizer_bytes = tensor_bytes(state + masters)
    stage = engine.zero_optimization_stage()
    world = engine.dp_world_size if hasattr(engine, "dp_world_size") else 1
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in {id(p): p for p in module.parameters()}.values())
    grad_elems = -(-numel // world) if stage >= 2 else numel
    grad_size = 2 if engine.bfloat16_enabled() or engine.fp16_enabled() else 4
    return {"params_bytes": params_bytes, "grads_bytes": grad_elems * grad_size, "optimizer_bytes": optimizer_bytes}
