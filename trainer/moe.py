"""Mixture-of-experts MLP: a top-k router sends each token to k of E expert MLPs (Shazeer et al. 2017; GShard,
Lepikhin et al. 2020; Switch, Fedus et al. 2021).

Shapes: N tokens (B·T flattened), C = d_model, E experts, k = top_k, cap = expert capacity.

Router:   p = softmax(x W_r) over the E experts (N, E), computed in fp32; the k largest p_e pick the experts.
          With k = 1 the chosen expert's output is weighted by its p (Switch); with k = 2 by p renormalised over the
          two chosen (GShard), so the weights sum to 1.
Capacity: each expert takes at most cap = ⌈capacity_factor · N · k / E⌉ tokens of one micro-batch (N counts this
          rank's tokens). Slots are filled first-choice first, in token order: every token's first choice is placed
          before any second choice. A choice past capacity is dropped: that expert contributes nothing and the token
          keeps only its residual (and its other choice). The dropped fraction is reported.
Aux loss: aux = E · Σ_e f_e · P_e, f_e the fraction of tokens whose first choice is e, P_e the mean router
          probability of e. It is 1 when routing is uniform and grows as load concentrates; only P carries gradient.
          The training loss adds aux_loss_coef · Σ over MoE layers of aux.

Expert parallel (``ExpertParallel``): the E experts are split over the ep ranks of a data-parallel group, E/ep each.
Each rank builds its (E, cap, C) dispatch buffer from its own tokens; one all-to-all sends expert j's rows to
the rank holding j, the experts run on ep·cap rows each, and a second all-to-all brings the outputs back. The
backward of an all-to-all is the reverse all-to-all. Expert parameters are replicated only over the dp/ep
ranks that hold the same experts, so their gradients are reduced over that group (see ``MoEGradSync``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainer.contract import ModelSpec


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ⌈capacity_factor · tokens · k / E⌉ (at least 1)."""
    return max(1, math.ceil(capacity_factor * tokens * top_k / n_experts))


@dataclass
class ExpertParallel:
    """The groups one MoE layer talks to: ``ep_group`` holds the other experts, ``edp_group`` the replicas of
    this rank's experts. Passed to each layer explicitly by ``apply_ep``."""

    ep: int
    ep_rank: int
    ep_group: object
    edp: int
    edp_group: object


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


@dataclass
class RoutingStats:
    """What the last forward of one layer routed: aux loss (with its graph), tokens per expert before capacity
    (E,), and the number of (token, choice) assignments dropped out of N·k."""

    aux: torch.Tensor
    load: torch.Tensor
    dropped: torch.Tensor
    assignments: int


class MoE(nn.Module):
    """Drop-in replacement of the MLP: (B, T, C) → (B, T, C)."""

    def __init__(self, spec: ModelSpec, make_expert: Callable[[], nn.Module]):
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = spec.n_experts, spec.top_k, spec.capacity_factor
        self.router = nn.Linear(spec.d_model, spec.n_experts, bias=False)
        # Keyed by global expert id, so names (and checkpoints) do not depend on which rank holds which expert.
        self.experts = nn.ModuleDict({str(e): make_expert() for e in range(spec.n_experts)})
        self.parallel: Optional[ExpertParallel] = None
        self.stats: Optional[RoutingStats] = None

    def local_experts(self) -> list[int]:
        return sorted(int(e) for e in self.experts.keys())

    def route(self, tokens: torch.Tensor):
        """tokens (N, C) → (slot (N, k) index into the flattened (E·cap) buffer, kept (N, k) bool, gate (N, k),
        cap); records the stats."""
        N, E, k = tokens.size(0), self.n_experts, self.top_k
        probs = F.softmax(self.router(tokens).float(), dim=-1)  # (N, E)
        top_p, top_e = probs.topk(k, dim=-1)  # (N, k)
        gate = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
        cap = capacity(N, E, k, self.capacity_factor)
        filled = torch.zeros(E, dtype=torch.long, device=tokens.device)
        positions = []
        for j in range(k):  # choice j of every token is placed after all choices < j
            onehot = F.one_hot(top_e[:, j], E)  # (N, E)
            pos = (torch.cumsum(onehot, 0) - 1 + filled) * onehot  # slot within the expert, where chosen
            positions.append(pos.sum(-1))  # (N,)
            filled = filled + onehot.sum(0)
        pos = torch.stack(positions, dim=-1)  # (N, k)
        kept = pos < cap
        first = F.one_hot(top_e[:, 0], E).float().mean(0)  # f_e
        aux = E * (first * probs.mean(0)).sum()
        self.stats = RoutingStats(aux=aux, load=filled.detach(), dropped=(~kept).sum().detach(), assignments=N * k)
        return top_e * cap + pos, kept, gate, cap

    def run_experts(self, buf: torch.Tensor) -> torch.Tensor:
        """(E, cap, C) → (E, cap, C): each expert on its own rows, across ranks when expert parallel."""
        if self.parallel is None or self.parallel.ep == 1:
            return torch.stack([self.experts[str(e)](buf[e]) for e in range(self.n_experts)])
        ep, mine = self.parallel.ep, self.local_experts()
        E_local, cap, C = len(mine), buf.size(1), buf.size(2)
        recv = _AllToAll.apply(buf, self.parallel.ep_group)  # (ep·E_local, cap, C): [source rank][local expert]
        recv = recv.view(ep, E_local, cap, C).transpose(0, 1).reshape(E_local, ep * cap, C)
        out = torch.stack([self.experts[str(e)](recv[i]) for i, e in enumerate(mine)])  # (E_local, ep·cap, C)
        out = out.view(E_local, ep, cap, C).transpose(0, 1).reshape(ep * E_local, cap, C)
        return _AllToAll.apply(out, self.parallel.ep_group)  # (E, cap, C) back in this rank's token order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        tokens = x.reshape(-1, C)  # (N, C)
        slot, kept, gate, cap = self.route(tokens)
        rows = torch.arange(tokens.size(0), device=x.device).unsqueeze(-1).expand_as(slot)[kept]  # (M,)
        slots = slot[kept]  # (M,) distinct: kept choices never share a slot
        buf = tokens.new_zeros(self.n_experts * cap, C).index_copy(0, slots, tokens[rows])
        out = self.run_experts(buf.view(self.n_experts, cap, C)).reshape(-1, C)  # (E·cap, C)
        weighted = out[slots] * gate[kept].unsqueeze(-1).to(out.dtype)  # (M, C)
        y = tokens.new_zeros(tokens.shape, dtype=weighted.dtype).index_add(0, rows, weighted)
        return y.view(B, T, C).to(x.dtype)


def moe_layers(modules) -> list[MoE]:
    return [m for module in modules for m in module.modules() if isinstance(m, MoE)]


def aux_loss(modules) -> Optional[torch.Tensor]:
    """Σ over this rank's MoE layers of the aux loss of their last forward (None for a dense model)."""
    layers = moe_layers(modules)
    if not layers:
        return None
    return torch.stack([m.stats.aux for m in layers]).sum()


def apply_ep(modules, groups: ExpertParallel) -> None:
    """Keep only this rank's E/ep experts in every MoE layer (before the weights get memory) and hand each layer
    its groups."""
    for layer in moe_layers(modules):
        per = layer.n_experts // groups.ep
        keep = {str(e) for e in range(groups.ep_rank * per, (groups.ep_rank + 1) * per)}
        for name in list(layer.experts.keys()):
            if name not in keep:
                del layer.experts[name]
        layer.parallel = groups


def is_expert_param(name: str) -> bool:
    return ".experts." in name


class MoEGradSync:
    """Gradient averaging over dp for a model with experts, after backward (DDP would average expert gradients
    over ranks that do not hold the same experts).

    The loss is the mean over dp ranks of each rank's loss. Dense weights: average over the dp group. An expert's
    gradient on its rank already sums the contributions of the tokens every ep partner sent it, so the full
    gradient is the sum over its edp replicas divided by dp."""

    def __init__(self, modules, dp_group, dp: int, groups: Optional[ExpertParallel]):
        named = {id(p): (n, p) for m in modules for n, p in m.named_parameters()}.values()
        self.dense = [p for n, p in named if not is_expert_param(n)]
        self.experts = [p for n, p in named if is_expert_param(n)]
        self.dp_group, self.dp, self.groups = dp_group, dp, groups

    def __call__(self) -> None:
        _reduce([p.grad for p in self.dense if p.grad is not None], self.dp_group, self.dp)
        if self.groups is None:  # ep = 1: experts are replicated like everything else
            _reduce([p.grad for p in self.experts if p.grad is not None], self.dp_group, self.dp)
        else:
            _reduce([p.grad for p in self.experts if p.grad is not None], self.groups.edp_group, self.dp)

    def norm_groups(self, dp: int) -> list[tuple[list[nn.Parameter], int]]:
        """(parameters, how many ranks hold each) for the global gradient norm."""
        if self.groups is None:
            return [(self.dense + self.experts, dp)]
        return [(self.dense, dp), (self.experts, self.groups.edp)]


def _reduce(grads: list[torch.Tensor], group, divide: int) -> None:
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if dist.get_world_size(group) > 1:
        dist.all_reduce(flat, group=group)
    flat /= divide
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def step_stats(modules, accumulated: Optional[dict], dp_group=None) -> Optional[dict]:
    """Add this micro-batch's routing stats to ``accumulated`` (per layer: load (E,), dropped, assignments)."""
    layers = moe_layers(modules)
    if not layers:
        return None
    acc = accumulated or {"aux": 0.0, "micro": 0, "load": [torch.zeros_like(m.stats.load) for m in layers],
                          "dropped": torch.zeros(len(layers), dtype=torch.long), "assignments": 0}
    acc["aux"] += float(sum(float(m.stats.aux.detach()) for m in layers))
    acc["micro"] += 1
    for i, m in enumerate(layers):
        acc["load"][i] = acc["load"][i] + m.stats.load
        acc["dropped"][i] += int(m.stats.dropped)
    acc["assignments"] += layers[0].stats.assignments
    return acc


def stats_metrics(acc: Optional[dict], group=None) -> dict:
    """Metrics of one step, summed over the dp ranks of ``group``: mean aux loss per micro-batch (Σ over layers),
    each MoE layer's share of assignments per expert, and the fraction of assignments dropped."""
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
