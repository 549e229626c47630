"""The next token of one sequence from its logits: greedy, temperature, top-k and top-p (nucleus) sampling, after
OpenAI's presence and frequency penalties where asked; and tokens' log-probabilities.

The same rule as the trainer's generation (``trainer.generate``), so a served model with a seed draws the tokens the
checkpoint draws; kept here too because this package stands alone in the server's environment.
"""
from __future__ import annotations

from typing import Optional

import torch

from .request import Sampling, TokenLogprob


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


def penalize(logits: torch.Tensor, counts: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """One sequence's logits (V,) less OpenAI's penalties, ``counts`` (V,) being how often each token was generated:
    presence_penalty once a token has appeared, frequency_penalty for each time it did."""
    return logits - sampling.presence_penalty * (counts > 0) - sampling.frequency_penalty * counts


def generator_for(sampling: Sampling, device: torch.device) -> Optional[torch.Generator]:
    if sampling.greedy or sampling.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(sampling.seed)


def scores(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """The log-probability of tokens[i] under the distribution of logits[i] (N, V), with the ``top`` most likely
    tokens of each row beside it: the model's raw distribution, as OpenAI's and vLLM's logprobs are."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, device=logits.device)].tolist()
    if top > 0:
        values, ids = logprobs.topk(min(top, logprobs.size(-1)), dim=-1)
        tops = [tuple(zip(row_ids, row_values)) for row_ids, row_values in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(tokens)
    return [TokenLogprob(token, value, best) for token, value, best in zip(tokens, chosen, tops)]
