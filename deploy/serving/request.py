"""A request as the engine takes it, and its answer: plain data and the sink the answer goes to (no torch, so the
scheduler that keeps requests runs and is tested without a model)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Protocol


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0            # 0: all tokens
    top_p: float = 1.0        # 1: all tokens
    seed: Optional[int] = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (end of text or a stop string), "length" (max_tokens), "cancelled"
    unsent: str = ""    # streamed requests: the end of the text not streamed yet (it went to the final answer)


class Sink(Protocol):
    """Where a request's answer goes (a Triton response sender, a queue in tests)."""

    def on_token(self, text: str, token_id: int) -> None: ...

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
        return found
