"""Structured output: a request's answer held to a grammar token by token (guided decoding), with llguidance.

A guide is JSON text: ``{"json_schema": {…}}`` (the answer is a JSON value of that schema) or ``{"json_object":
true}`` (any JSON object). Before each token the matcher masks every token that would leave the grammar; once the
answer is complete, only the end of text may follow, so the answer ends there ("stop"). JSON is written compactly
(no optional whitespace), so a small model cannot wander in spaces. Log-probabilities stay the model's own, before
the mask.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Optional

import torch


class GuideError(ValueError):
    """A guide that cannot be followed; the message says why."""


def grammar_for(guide: str) -> str:
    """llguidance's grammar of a guide (GuideError if the guide is not one)."""
    from llguidance import LLMatcher

    try:
        spec = json.loads(guide)
    except ValueError as exc:
        raise GuideError(f"the guide is not JSON: {exc}") from None
    if not isinstance(spec, dict) or len(spec) != 1 or not ("json_schema" in spec or spec.get("json_object") is True):
        raise GuideError('give a guide as {"json_schema": {…}} or {"json_object": true}')
    schema = spec["json_schema"] if "json_schema" in spec else {"type": "object"}
    if not isinstance(schema, dict):
        raise GuideError("json_schema: give the schema as a JSON object")
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    except ValueError as exc:
        raise GuideError(f"json_schema: {exc}") from None


class Guides:
    """Guided decoding for one model: its tokenizer (read by llguidance once, when first needed), its vocabulary
    (the logits' width, which may be wider than the tokenizer's) and its end-of-text token."""

    def __init__(self, tokenizer: Path, vocab_size: int, eos_id: Optional[int]):
        self.path, self.vocab_size, self.eos_id = tokenizer, vocab_size, eos_id

    @cached_property
    def _tokenizer(self):
        from llguidance import LLTokenizer

        # the file's text, read as UTF-8 here: inside Triton's stub (the C locale) a path is opened as ASCII
        return LLTokenizer(self.path.read_text(encoding="utf-8"), n_vocab=self.vocab_size, eos_token=self.eos_id)

    def start(self, guide: str) -> "Guided":
        """The matcher of one answer (GuideError where the guide cannot be followed)."""
        from llguidance import LLMatcher

        if self.eos_id is None:
            raise GuideError("this model's tokenizer has no end-of-text token, so a structured answer could not end")
        matcher = LLMatcher(self._tokenizer, grammar_for(guide))
        if matcher.is_error():
            raise GuideError(f"the guide cannot be followed: {matcher.get_error()}")
        return Guided(matcher, self.vocab_size)


class Guided:
    """One answer's place in its grammar. The mask is llguidance's bitmask (a bit a token, 32 to an int32), filled
    with its numpy helper and applied here: its torch module compiles a kernel with torch.compile on import, which a
    CPU server need not pay for (and which reads its templates as ASCII inside Triton's stub)."""

    _BITS = torch.arange(32, dtype=torch.int32)

    def __init__(self, matcher, vocab_size: int):
        from llguidance.numpy import allocate_token_bitmask

        self.matcher, self.vocab_size = matcher, vocab_size
        self._mask = allocate_token_bitmask(1, vocab_size)

    def allowed(self, logits: torch.Tensor) -> torch.Tensor:
        """One sequence's logits (V,), with every token the grammar does not allow next at −inf (a copy)."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, self._mask, 0)
        words = torch.from_numpy(self._mask[0]).view(-1, 1)
        allowed = ((words >> self._BITS) & 1).view(-1)[:self.vocab_size].bool().to(logits.device)
        return logits.float().masked_fill(~allowed, float("-inf"))

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)
