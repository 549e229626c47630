"""Mixture-of-experts layers on pipeline stages: the aux loss reaches backward, the routing figures reach the metrics.

Without a pipeline the engine adds aux_loss_coef · Σ aux to the loss it differentiates. A pipeline schedule calls its
loss function on the last stage only, with the logits, so a stage's aux losses cannot be added there. Instead each
MoE layer's output passes through ``_AttachAux``, the identity in forward whose backward also sends
d(objective)/d(aux) = aux_loss_coef × the loss scale into that layer's aux loss (Megatron-LM's MoEAuxLossAutoScaler).
The schedule backpropagates each micro-batch from its stage outputs, so the aux gradient joins the layer's router at
the same point of the same backward; the schedule's 1/m over micro-batches (scale_grads) applies to it as to the
cross-entropy, as the engine's objective · 1/m does without a pipeline. The reported loss stays the cross-entropy.

Routing figures: each MoE layer records, per micro-batch it runs in training, its aux loss, tokens per expert and
dropped assignments. The schedule's first step also runs each stage once on placeholder inputs to learn the shapes
it sends; that forward is recorded too and left out by keeping the last m records of each layer. A forward that a
checkpointed block reruns inside backward is not recorded. ``take`` sums the stages' layers over the pipeline group
into the form ``trainer.parallel.expert.routing_metrics`` reads for the whole model, as one process records it.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from trainer.contract import ModelSpec
from trainer.model.moe import MoE


class _AttachAux(torch.autograd.Function):
    """y = x in forward; in backward x's gradient passes unchanged and ``aux`` receives ``scale`` (a number)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale, ctx.aux_shape, ctx.aux_dtype = scale, aux.shape, aux.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.full(ctx.aux_shape, ctx.scale, dtype=ctx.aux_dtype, device=grad.device), None


def _recomputing() -> bool:
    """Whether this forward runs inside a backward pass (activation checkpointing's rerun)."""
    return torch._C._current_graph_task_id() != -1


class StageRouting:
    """The MoE layers of this rank's pipeline stages: attaches their aux losses to backward and collects their
    routing figures for one step."""

    def __init__(self, spec: ModelSpec, stages: list[nn.Module], pp_group, aux_scale: Callable[[], float]):
        self.spec, self.pp_group, self.aux_scale = spec, pp_group, aux_scale
        order = {layer: i for i, layer in enumerate(spec.moe_layers)}  # global layer index → position among MoE
        self.records: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]] = {}
        for stage in stages:
            for name, block in stage.layers.items():
                if isinstance(block.mlp, MoE):
                    position = order[int(name)]
                    self.records[position] = []
                    block.mlp.register_forward_hook(self._hook(position))

    def _hook(self, position: int):
        def after_forward(module: MoE, args, out: torch.Tensor):
            if not module.training:
                return None
            stats = module.stats
            if not _recomputing():
                self.records[position].append((stats.aux.detach(), stats.load, stats.dropped, stats.assignments))
            if torch.is_grad_enabled() and stats.aux.requires_grad:
                return _AttachAux.apply(out, stats.aux, self.aux_scale())
            return None
        return after_forward

    def take(self, n_micro: int, device: torch.device) -> Optional[dict]:
        """The step's routing figures of every MoE layer of the model, the same on every stage (collective over the
        pipeline group: every stage calls it), in ``trainer.model.moe.step_stats``'s form; the records cleared."""
        n_layers, E = len(self.spec.moe_layers), self.spec.n_experts
        load = torch.zeros(n_layers, E, dtype=torch.float64, device=device)
        per_layer = torch.zeros(4, n_layers, dtype=torch.float64, device=device)  # aux, micro, dropped, assignments
        for position, records in self.records.items():
            for aux, counts, dropped, assignments in records[-n_micro:]:
                load[position] += counts.to(device, torch.float64)
                per_layer[:, position] += torch.stack([aux.to(device, torch.float64).reshape(()),
                                                       torch.ones((), dtype=torch.float64, device=device),
                                                       dropped.to(device, torch.float64).reshape(()),
                                                       torch.tensor(float(assignments), dtype=torch.float64,
                                                                    device=device)])
            records.clear()
        packed = torch.cat([load.flatten(), per_layer.flatten()])
        if dist.is_initialized() and dist.get_world_size(self.pp_group) > 1:
            dist.all_reduce(packed, group=self.pp_group)
        load = packed[:load.numel()].view(n_layers, E).cpu()
        aux, micro, dropped, assignments = packed[load.numel():].view(4, n_layers).cpu()
        # every MoE layer runs the same micro-batches of the same tokens: the first one's counts are the step's
        return {"aux": float(aux.sum()), "micro": int(micro[0]), "load": list(load), "dropped": dropped.long(),
                "assignments": int(assignments[0])}
