"""A validated plan becomes this rank's part of the model, as an ordered list of apply_… steps on one device mesh:

    device mesh (pp, dp, cp, tp) → pipeline stages → tensor/sequence parallel → context parallel
      → activation checkpointing → expert parallel → FSDP2 or DDP (or a gradient sync after backward) → weights
      → pipeline schedule

The order matters: FSDP2 shards the DTensors that tensor parallel made (2-D: Shard over dp, then over tp), and
wraps modules whose forward already recomputes where asked; pipeline stages are cut first so that each stage is
sharded on its own; ring attention replaces attention's core before recomputation wraps it (so a checkpointed
block reruns the ring); gradients are averaged over dp·cp, the ranks that hold whole weights and different tokens;
weights are filled last, each rank only its own shards. The plan was checked by the contract
(``trainer.contract.rules``) before any process started; nothing here refuses a plan.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.stages import stage_layer_ranges
from trainer.model import GPT, tie_weights
from trainer.parallel.ac import apply_ac
from trainer.parallel.clip import global_grad_norm
from trainer.parallel.context import apply_cp
from trainer.parallel.data_parallel import ReplicatedGradSync, apply_ddp, apply_fsdp
from trainer.parallel.expert import ExpertParallel, MoEGradSync, apply_ep, expert_groups
from trainer.parallel.init import init_sharded_weights
from trainer.parallel.mesh import Topology, build_topology
from trainer.parallel.moe_stages import StageRouting
from trainer.parallel.pipeline import TiedEmbeddingSync, build_schedule, split_stage, stage_ids, tied_embedding_sync
from trainer.parallel.tensor import apply_tp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class ParallelModel:
    """This rank's share of the model.

    ``modules``: the model chunks it holds (one; v with the interleaved schedule), unwrapped: names, parameters,
    checkpoints. ``callables``: what to run (DDP wrappers where DDP is used). ``schedule``: the pipeline schedule
    when pp > 1. ``grad_sync``: a dp gradient average to run after backward when neither DDP nor FSDP does it.
    """

    topo: Topology
    modules: list[GPT]
    callables: list[nn.Module]
    schedule: Optional[object] = None
    stage_ids: list[int] = field(default_factory=lambda: [0])
    n_stages: int = 1
    grad_sync: Optional[ReplicatedGradSync | MoEGradSync] = None
    tied_sync: Optional[TiedEmbeddingSync] = None  # embedding ↔ head across pipeline stages
    fsdp: bool = False
    loss_parallel: bool = False
    experts: Optional[ExpertParallel] = None  # expert-parallel groups when ep > 1
    routing: Optional[StageRouting] = None  # MoE layers on pipeline stages: aux loss into backward, routing figures
    _norm_parameters: Optional[list[nn.Parameter]] = field(default=None, repr=False)

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last_stage(self) -> bool:
        return self.n_stages - 1 in self.stage_ids

    def parameters(self) -> list[nn.Parameter]:
        return list({id(p): p for m in self.modules for p in m.parameters()}.values())

    def norm_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradients count in the global norm: a tied head copied onto the last stage does not.
        Listed on the first step's call, once built: walking the module tree every step costs ~0.1 ms."""
        if self._norm_parameters is None:
            skip = self.tied_sync.norm_duplicate if self.tied_sync is not None else None
            self._norm_parameters = [p for p in self.parameters() if p is not skip]
        return self._norm_parameters

    def gradient_sync(self, last: bool):
        """Around one micro-batch's backward: DDP and FSDP2 reduce gradients only on the last micro-batch of a step
        (one reduction per step, not per micro-batch)."""
        if self.fsdp and self.topo.replicas > 1:
            self.modules[0].set_requires_gradient_sync(last)
        model = self.callables[0]
        if not last and self.topo.replicas > 1 and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def grad_norm(self, device: torch.device) -> torch.Tensor:
        """‖g‖₂ over the whole model. Expert weights under expert parallel are held by dp/ep ranks, not dp; the
        cp ranks of one sequence hold the same (averaged) gradients, as dp replicas do."""
        dp_tp = self.topo.replicas * self.topo.tp
        if isinstance(self.grad_sync, MoEGradSync):
            counted = {id(p) for p in self.norm_parameters()}  # not a tied head's copy on the last stage
            parts = [global_grad_norm([p for p in ps if id(p) in counted], replicas, device)
                     for ps, replicas in self.grad_sync.norm_groups(dp_tp, self.topo.tp)]
            return torch.stack(parts).pow(2).sum().sqrt()
        return global_grad_norm(self.norm_parameters(), dp_tp, device)

    def sync_gradients(self) -> None:
        """What backward leaves undone: the dp average (when DDP/FSDP do not), then the tied-embedding sum."""
        if self.grad_sync is not None:
            self.grad_sync()
        if self.tied_sync is not None:
            self.tied_sync()


def parallelize(spec: ModelSpec, plan: ParallelPlan, device: torch.device, seed: int,
                loss_fn: Callable, aux_scale: Optional[Callable[[], float]] = None) -> ParallelModel:
    """``aux_scale``: d(objective)/d(aux loss) of a micro-batch, aux_loss_coef times the loss scale, for the MoE layers
    of pipeline stages (``trainer.parallel.moe_stages``); aux_loss_coef when not given."""
    topo = build_topology(plan, device)
    # Shapes only (meta device): no rank ever holds more than its own part of the weights.
    with torch.device("meta"):
        full = GPT(spec)
    n_stages = plan.pp * plan.virtual_stages
    ids = stage_ids(topo.pp_rank, plan.pp, plan.virtual_stages, plan.pipeline_schedule) if plan.pp > 1 else [0]
    layers = stage_layer_ranges(spec.n_layers, plan) if plan.pp > 1 else ()
    modules = [split_stage(full, i, layers) for i in ids] if plan.pp > 1 else [full]
    loss_parallel = plan.tp > 1
    for m in modules:
        if plan.tp > 1:
            apply_tp(m, topo.tp_mesh, plan.sequence_parallel, loss_parallel)
        if plan.cp > 1:
            apply_cp(m, topo.cp_group, plan.cp, topo.cp_rank)
        apply_ac(m, plan.activation_checkpointing)
    experts = expert_groups(topo, plan.ep) if spec.is_moe and plan.ep > 1 else None
    if experts is not None:
        apply_ep(modules, experts)
    fsdp = plan.zero_stage == 3
    if fsdp:
        for m in modules:
            # With a pipeline each block runs several micro-batches: keep it gathered from forward to backward.
            apply_fsdp(m, topo.replica_mesh, DTYPES[plan.precision] if plan.precision == "bf16" else torch.float32,
                       reshard_after_forward=plan.pp == 1)
    for m in modules:
        m.to_empty(device=device)
        tie_weights(m)
        init_sharded_weights(m, seed)
    callables: list[nn.Module] = list(modules)
    grad_sync = None
    if fsdp:
        pass  # FSDP2 reduce-scatters gradients itself
    elif spec.is_moe and plan.dp > 1:  # DDP would average expert gradients over ranks holding other experts
        grad_sync = MoEGradSync(modules, topo.dp_group, plan.dp, experts)
    elif topo.replicas > 1 and plan.tp == 1 and plan.pp == 1:
        callables = [apply_ddp(m, topo.replica_group, device) for m in modules]
    elif topo.replicas > 1:
        grad_sync = ReplicatedGradSync(list({id(p): p for m in modules for p in m.parameters()}.values()),
                                       topo.replica_group, topo.replicas)
    pm = ParallelModel(topo=topo, modules=modules, callables=callables, stage_ids=ids, n_stages=n_stages,
                       grad_sync=grad_sync, fsdp=fsdp, loss_parallel=loss_parallel, experts=experts)
    if plan.pp > 1 and spec.tied_embeddings:
        pm.tied_sync = tied_embedding_sync(modules, topo.mesh, plan.pp, plan.pipeline_schedule)
    if plan.pp > 1 and spec.is_moe:
        pm.routing = StageRouting(spec, modules, topo.pp_group, aux_scale or (lambda: spec.aux_loss_coef))
    if plan.pp > 1:
        pm.schedule = build_schedule(plan.pipeline_schedule, callables, ids, n_stages, plan.grad_accum, loss_fn,
                                     topo.pp_group, device)
    return pm
