"""The next token of one sequence from its logits: greedy, temperature, top-k and top-p (nucleus) sampling.

The same rule as the trainer's generation (``trainer.generate``), so a served model with a seed draws the tokens the
checkpoint draws; kept here too because this package stands alone in the server's environment.
"""
from __future__ import annotations

from typing import Optional

import torch

from .request import Sampling


def pick(logits: torch.Tensor, sampling: Sampling, gen: Optional[torch.Generator]) -> int:
    """Token id from one sequence's last-position logits (V,)."""
    if sampling.greedy:
        return int(logits.argmax())
    logits = logits.float().unsqueeze(0) / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(logits, min(sampling.top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < sampling.top_p < 1.0:
        # Keep the smallest set of most likely tokens whose probabilities sum to at least top_p.
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= sampling.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return int(torch.multinomial(logits.softmax(dim=-1), 1, generator=gen)[0, 0])


def generator_for(sampling: Sampling, device: torch.device) -> Optional[torch.Generator]:
    if sampling.greedy or sampling.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(sampling.seed)
