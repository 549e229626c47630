"""Mixture-of-experts MLP: a top-k router sends each token to k of E expert MLPs (Shazeer et al. 2017; GShard,
Lepikhin et al. 2020; Switch, Fedus et al. 2021).

Shapes: N tokens (B·T flattened), C = d_model, E experts, k = top_k, cap = expert capacity.

Router:   p = softmax(x W_r) over the E experts (N, E), computed in fp32; the k largest p_e pick the experts.
          Each chosen expert's output is weighted by its p as it is (Switch, Qwen2-MoE), or by p renormalised over
          the k chosen so the weights sum to 1 (GShard, Mixtral): spec.renormalizes_topk.
Capacity: each expert takes at most cap = ⌈capacity_factor · N · k / E⌉ tokens of one micro-batch (N counts this
          rank's tokens); capacity_factor 0 means cap = N, room for every token, so none is dropped (what Hugging
          Face's Mixtral and Qwen2-MoE compute). Slots are filled first-choice first, in token order: every
          token's first choice is placed before any second choice. A choice past capacity is dropped: that expert
          contributes nothing and the token keeps only its residual (and its other choice). The dropped fraction
          is reported.
Shared:   with spec.shared_expert_ffn, one more MLP (``shared``) that every token passes through, added to the
          routed experts' sum; with spec.shared_expert_gate it is scaled by sigmoid(x · w) per token
          (``shared_gate``, C → 1), as in Qwen2-MoE.
Aux loss: aux = E · Σ_e f_e · P_e, f_e the fraction of tokens whose first choice is e, P_e the mean router
          probability of e. It is 1 when routing is uniform and grows as load concentrates; only P carries gradient.
          The training loss adds aux_loss_coef · Σ over MoE layers of aux.

Expert parallel (trainer.parallel.expert) keeps E/ep of the experts on each rank and exchanges tokens around the
``experts`` module; this layer runs unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from trainer.contract import ModelSpec


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ⌈capacity_factor · tokens · k / E⌉ (at least 1); every token (a token chooses an expert at
    most once) when capacity_factor is 0."""
    if capacity_factor == 0:
        return max(1, tokens)
    return max(1, math.ceil(capacity_factor * tokens * top_k / n_experts))


@dataclass
class RoutingStats:
    """What the last forward of one layer routed: aux loss (with its graph), tokens per expert before capacity
    (E,), and the number of (token, choice) assignments dropped out of N·k."""

    aux: torch.Tensor
    load: torch.Tensor
    dropped: torch.Tensor
    assignments: int


class Experts(nn.ModuleDict):
    """The experts of one layer, keyed by global expert id (names, and so checkpoints, do not depend on which rank
    holds which expert). (E_held, rows, C) → (E_held, rows, C): each held expert, in id order, on its own rows."""

    def forward(self, buf: torch.Tensor) -> torch.Tensor:
        held = sorted(self.keys(), key=int)
        return torch.stack([self[e](buf[i]) for i, e in enumerate(held)])


class MoE(nn.Module):
    """Drop-in replacement of the MLP: (B, T, C) → (B, T, C). ``make_expert`` builds one routed expert,
    ``make_shared`` the shared expert (None: no shared expert)."""

    def __init__(self, spec: ModelSpec, make_expert: Callable[[], nn.Module],
                 make_shared: Optional[Callable[[], nn.Module]] = None):
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = spec.n_experts, spec.top_k, spec.capacity_factor
        self.renormalize = spec.renormalizes_topk
        self.router = nn.Linear(spec.d_model, spec.n_experts, bias=False)
        self.experts = Experts({str(e): make_expert() for e in range(spec.n_experts)})
        self.shared = make_shared() if make_shared is not None else None
        self.shared_gate = (nn.Linear(spec.d_model, 1, bias=False)
                            if self.shared is not None and spec.shared_expert_gate else None)
        self.stats: Optional[RoutingStats] = None

    def route(self, tokens: torch.Tensor):
        """tokens (N, C) → (slot (N, k) index into the flattened (E·cap) buffer, kept (N, k) bool, gate (N, k),
        cap); records the stats."""
        N, E, k = tokens.size(0), self.n_experts, self.top_k
        probs = F.softmax(self.router(tokens).float(), dim=-1)  # (N, E)
        top_p, top_e = probs.topk(k, dim=-1)  # (N, k)
        gate = top_p / top_p.sum(-1, keepdim=True) if self.renormalize else top_p
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        tokens = x.reshape(-1, C)  # (N, C)
        slot, kept, gate, cap = self.route(tokens)
        rows = torch.arange(tokens.size(0), device=x.device).unsqueeze(-1).expand_as(slot)[kept]  # (M,)
        slots = slot[kept]  # (M,) distinct: kept choices never share a slot
        buf = tokens.new_zeros(self.n_experts * cap, C).index_copy(0, slots, tokens[rows])
        out = self.experts(buf.view(self.n_experts, cap, C)).reshape(-1, C)  # (E·cap, C)
        weighted = out[slots] * gate[kept].unsqueeze(-1).to(out.dtype)  # (M, C)
        y = tokens.new_zeros(tokens.shape, dtype=weighted.dtype).index_add(0, rows, weighted)
        if self.shared is not None:
            shared = self.shared(tokens)  # (N, C)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(tokens)) * shared  # (N, 1) per-token scale
            y = y + shared.to(y.dtype)
        return y.view(B, T, C).to(x.dtype)


def moe_layers(modules) -> list[MoE]:
    return [m for module in modules for m in module.modules() if isinstance(m, MoE)]


def aux_loss(modules) -> Optional[torch.Tensor]:
    """Σ over this rank's MoE layers of the aux loss of their last forward (None for a dense model)."""
    layers = moe_layers(modules)
    if not layers:
        return None
    return torch.stack([m.stats.aux for m in layers]).sum()


def step_stats(modules, accumulated: Optional[dict]) -> Optional[dict]:
    """Add this micro-batch's routing stats to ``accumulated`` (per layer: load (E,), dropped, assignments); the
    step's figures are summed over ranks by ``trainer.parallel.expert.routing_metrics``."""
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
