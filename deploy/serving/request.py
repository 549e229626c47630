"""A request as the engine takes it, and its answer: plain data and the sink the answer goes to (no torch, so the
scheduler that keeps requests runs and is tested without a model)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol


MAX_LOGPROBS = 20  # most likely tokens listed beside each token's log-probability, at most (OpenAI's bound)
MAX_PENALTY = 2.0  # OpenAI's bound on presence_penalty and frequency_penalty


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0            # 0: all tokens
    top_p: float = 1.0        # 1: all tokens
    seed: Optional[int] = None
    logprobs: int = -1         # the drawn tokens' log-probabilities, with the k most likely beside each (-1: none)
    prompt_logprobs: int = -1  # the same for each prompt token after the first (-1: none)
    # OpenAI's penalties on the tokens generated so far: each token's logit lowered by presence_penalty once it has
    # appeared and by frequency_penalty times its count (a negative value raises it)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model (its raw distribution: before temperature, top-k or top-p), and
    the most likely tokens at that position, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of text or a stop string), "length" (max_tokens), "cancelled"
    unsent: str = ""    # streamed requests: the end of the text not streamed yet (it went to the final answer)
    logprobs: Optional[list[TokenLogprob]] = None  # of each generated token, where the sampling asked for them
    prompt_logprobs: Optional[list[TokenLogprob]] = None  # of the prompt's tokens after the first, where asked


class Sink(Protocol):
    """Where a request's answer goes (a Triton response sender, a queue in tests)."""

    def on_token(self, text: str, token_id: int, logprob: Optional[TokenLogprob] = None) -> None: ...

    def on_finish(self, result: Result) -> None: ...

    def on_error(self, message: str) -> None: ...

    def is_cancelled(self) -> bool: ...


@dataclass
class Request:
    prompt_ids: list[int]
    sink: Sink
    max_tokens: int = 64
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    stream: bool = False
    guided: Optional[Any] = None  # the answer's grammar, where structured output is asked (deploy.serving.guide)
    arrived: float = field(default_factory=time.perf_counter)

    def problems(self) -> list[str]:
        found = []
        if not self.prompt_ids:
            found.append("the prompt is empty: give at least one token of text")
        if self.max_tokens < 1:
            found.append(f"max_tokens={self.max_tokens}: ask for at least 1")
        if self.sampling.temperature < 0 or not 0 < self.sampling.top_p <= 1 or self.sampling.top_k < 0:
            found.append(f"temperature={self.sampling.temperature} must be ≥ 0, top_p={self.sampling.top_p} in "
                         f"(0, 1], top_k={self.sampling.top_k} ≥ 0")
        if not all(-MAX_PENALTY <= p <= MAX_PENALTY for p in (self.sampling.presence_penalty,
                                                                self.sampling.frequency_penalty)):
            found.append(f"presence_penalty={self.sampling.presence_penalty} and frequency_penalty="
                         f"{self.sampling.frequency_penalty} must be within ±{MAX_PENALTY}")
        if not -1 <= self.sampling.logprobs <= MAX_LOGPROBS or not -1 <= self.sampling.prompt_logprobs <= MAX_LOGPROBS:
            found.append(f"logprobs={self.sampling.logprobs} and prompt_logprobs={self.sampling.prompt_logprobs}: "
                         f"give -1 (none) or 0 to {MAX_LOGPROBS} most likely tokens beside each")
        return found
