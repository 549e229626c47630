"""Expert parallel: the E experts of each mixture-of-experts layer spread over the ep ranks of a data-parallel group.

Groups come from the one device mesh (``mesh.Topology``): its dp dimension unflattened into (edp, ep), ep innermost,
so data-parallel rank d = edp_rank · ep + ep_rank. The ep ranks of one group hold different experts (E/ep each)
and exchange tokens; the edp ranks hold copies of the same experts and reduce their gradients.

Dispatch: each rank builds its (E, cap, C) buffer from its own tokens (``trainer.model.moe``); one all-to-all sends
expert j's rows to the rank holding j, where each of its E/ep experts runs on ep·cap rows, and a second all-to-all
brings the outputs back in the rank's own token order. The backward of an all-to-all is the reverse all-to-all.
Both are hooks on the layer's ``experts`` module, so the layer itself runs unchanged.

Gradients: an expert's gradient on its rank already sums the contributions of the tokens every ep partner sent it,
so its full gradient is the sum over its edp replicas divided by dp; dense weights average over dp
(``MoEGradSync``). The routing figures of a step are summed over the dp ranks (``routing_metrics``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from trainer.model.moe import moe_layers
from trainer.parallel.data_parallel import average_gradients
from trainer.parallel.mesh import Topology


@dataclass(frozen=True)
class ExpertParallel:
    """The groups one MoE layer talks to: ``ep_group`` holds the other experts, ``edp_group`` the replicas of
    this rank's experts."""

    ep: int
    ep_rank: int
    ep_group: object
    edp: int
    edp_group: object


def expert_groups(topo: Topology, ep: int) -> ExpertParallel:
    """This rank's ep and edp groups, from the mesh's dp dimension split as (edp, ep)."""
    mesh = topo.expert_mesh(ep)
    return ExpertParallel(ep=ep, ep_rank=mesh.get_local_rank("ep"), ep_group=mesh.get_group("ep"),
                          edp=topo.dp // ep, edp_group=mesh.get_group("edp"))


class _AllToAll(torch.autograd.Function):
    """Split dim 0 into equal chunks; chunk j goes to rank j of ``group``; what rank j sent lands at chunk j."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllToAll.apply(grad, ctx.group), None


def _dispatch(groups: ExpertParallel, n_local: int):
    def pre(module, args):
        (buf,) = args  # (E, cap, C) in this rank's token order
        _, cap, C = buf.shape
        recv = _AllToAll.apply(buf, groups.ep_group)  # (ep·E_local, cap, C): [source rank][local expert]
        return (recv.view(groups.ep, n_local, cap, C).transpose(0, 1).reshape(n_local, groups.ep * cap, C),)
    return pre


def _combine(groups: ExpertParallel, n_local: int):
    def post(module, args, out):
        C = out.size(-1)  # (E_local, ep·cap, C)
        cap = out.size(1) // groups.ep
        out = out.view(n_local, groups.ep, cap, C).transpose(0, 1).reshape(groups.ep * n_local, cap, C)
        return _AllToAll.apply(out, groups.ep_group)  # (E, cap, C) back in this rank's token order
    return post


def apply_ep(modules: list[nn.Module], groups: ExpertParallel) -> None:
    """Keep only this rank's E/ep experts in every MoE layer (before the weights get memory) and put the token
    exchange around their computation."""
    for layer in moe_layers(modules):
        per = layer.n_experts // groups.ep
        keep = {str(e) for e in range(groups.ep_rank * per, (groups.ep_rank + 1) * per)}
        for name in list(layer.experts.keys()):
            if name not in keep:
                del layer.experts[name]
        layer.experts.register_forward_pre_hook(_dispatch(groups, per))
        layer.experts.register_forward_hook(_combine(groups, per))


def is_expert_param(name: str) -> bool:
    return ".experts." in name


class MoEGradSync:
    """Gradient averaging over dp for a model with experts, after backward (DDP would average expert gradients
    over ranks that do not hold the same experts). The loss is the mean over dp ranks of each rank's loss."""

    def __init__(self, modules: list[nn.Module], dp_group, dp: int, groups: Optional[ExpertParallel]):
        named = {id(p): (n, p) for m in modules for n, p in m.named_parameters()}.values()
        self.dense = [p for n, p in named if not is_expert_param(n)]
        self.experts = [p for n, p in named if is_expert_param(n)]
        self.dp_group, self.dp, self.groups = dp_group, dp, groups

    def __call__(self) -> None:
        average_gradients([p.grad for p in self.dense if p.grad is not None], self.dp_group, self.dp)
        group = self.dp_group if self.groups is None else self.groups.edp_group  # ep = 1: experts are replicated
        average_gradients([p.grad for p in self.experts if p.grad is not None], group, self.dp)

    def norm_groups(self, dp_tp: int, tp: int) -> list[tuple[list[nn.Parameter], int]]:
        """(parameters, how many ranks of a stage hold each whole or in tp shards) for the global gradient norm:
        dense weights dp·tp, experts edp·tp under expert parallel."""
        if self.groups is None:
            return [(self.dense + self.experts, dp_tp)]
        return [(self.dense, dp_tp), (self.experts, self.groups.edp * tp)]


def routing_metrics(acc: Optional[dict], group=None) -> dict:
    """Metrics of one step, summed over the dp ranks of ``group``: mean aux loss per micro-batch (Σ over layers),
    each MoE layer's share of assignments per expert, and the fraction of assignments dropped. ``acc`` is what
    ``trainer.model.moe.step_stats`` accumulated over the step's micro-batches; {} for a dense model."""
    if acc is None:
        return {}
    load = torch.stack(acc["load"]).double()  # (layers, E)
    packed = torch.cat([load.flatten(), acc["dropped"].double(),
                        torch.tensor([acc["aux"], acc["micro"], acc["assignments"]], dtype=torch.float64)])
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(packed, group=group)
    n_load = load.numel()
    load = packed[:n_load].view_as(load)
    dropped = packed[n_load:n_load + load.size(0)]
    aux, micro, assignments = packed[-3:].tolist()
    return {"aux_loss": aux / micro,
            "expert_load": (load / load.sum(-1, keepdim=True)).tolist(),
            "dropped_fraction": float(dropped.sum() / (assignments * load.size(0)))}
