"""A deployment's context window: how many tokens a prompt is, and whether it fits with the answer asked for.

The served engines take text and do not refuse what overflows the model's context: ours keeps the prompt's last
seq_len tokens and slides its window along the answer (deploy.serving.engine), so a 1,200-token prompt to a 64-token
model would be answered from its last 64 tokens, and 1,000 new tokens asked of it would all come, each from a window
that no longer holds the prompt. So the prompt is counted here, before it is sent, with the checkpoint's own
tokenizer (the file the export copies beside the weights; read with ``tokenizers``, which needs no torch), and
what does not fit is refused as OpenAI refuses it (``context_length_exceeded``), or, where the request asks for it
(``truncate_prompt_tokens``, vLLM's name), the prompt is cut from the left to its last tokens first:

- max_tokens the request gives is kept, or refused with the context it would overflow; never lowered;
- max_tokens the request leaves out (a default: OpenAI's, the prompt template's) is lowered to what the context
  has left after the prompt, as OpenAI does when it is left out;
- truncate_prompt_tokens=k keeps the prompt's last k tokens (-1: as many as the context holds); the cut is made
  where a token begins, in the text, so that the engine, which tokenizes the text again, reads at most k tokens.
"""
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from trainer.contract import ModelSpec, SpecError

from ..models import Deployment
from .triton import ServingRejected, ServingUnavailable

KEEP_ALL_THAT_FITS = -1  # truncate_prompt_tokens=-1: vLLM's "the model's context length"


class PromptRefused(ServingRejected):
    """The prompt and the answer asked for do not fit the model's context (400, OpenAI's code), naming the
    parameter to change."""

    def __init__(self, message: str, param: str, code: str = "context_length_exceeded"):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class FittedPrompt:
    prompt: str         # the text to send: the request's, or its end where it asked for a cut
    prompt_tokens: int  # what the engine will count of it
    max_tokens: int     # the answer's length, within what the context has left


def context_length(deployment: Deployment) -> int:
    """The model's context (its seq_len), from the checkpoint's manifest."""
    try:
        return ModelSpec.from_dict(deployment.checkpoint.manifest.get("model") or {}).seq_len
    except (SpecError, TypeError, AttributeError) as exc:
        raise ServingUnavailable(f"deployment {deployment.pk} has no valid model in its checkpoint's manifest "
                                 f"({exc}): register the checkpoint again and deploy it again") from None


@lru_cache(maxsize=16)
def _tokenizer_file(path: str, modified_ns: int, size: int) -> Tokenizer:  # keyed by the file's version too
    return Tokenizer.from_file(path)


def tokenizer_for(deployment: Deployment) -> Tokenizer:
    """The tokenizer the deployment's engine reads its prompts with: the checkpoint's, which the export copies."""
    path = str((deployment.checkpoint.manifest or {}).get("tokenizer") or "")
    try:
        found = Path(path).stat()
        return _tokenizer_file(path, found.st_mtime_ns, found.st_size)
    except Exception as exc:  # noqa: BLE001 - missing, unreadable or not a tokenizer: the prompt cannot be counted
        raise ServingUnavailable(f"deployment {deployment.pk} cannot count its prompts' tokens: the checkpoint's "
                                 f"tokenizer ({path or 'none recorded'}) cannot be read ({type(exc).__name__}: "
                                 f"{exc}); put it back, or register and deploy the checkpoint again") from None


def _count(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text).ids)  # as the engine encodes it: with the special tokens the tokenizer adds


def keep_last_tokens(tokenizer: Tokenizer, text: str, keep: int) -> tuple[str, int]:
    """The end of ``text`` that is at most ``keep`` tokens, cut where a token begins, and its count.

    Text cut where a token begins is usually tokenized into the same tokens after it; where it is not (a merge
    across the cut, several tokens of one character), the cut moves right to the next token until it fits."""
    encoding = tokenizer.encode(text)
    starts = [start for (start, end), special in zip(encoding.offsets, encoding.special_tokens_mask)
              if not special and end > start]
    first = starts[max(0, len(starts) - keep)] if starts else len(text)
    for start in sorted({s for s in starts if s >= first}):
        tail = text[start:]
        count = _count(tokenizer, tail)
        if count <= keep:
            return tail, count
    return "", _count(tokenizer, "")


def _exceeded(context: int, prompt_tokens: int, max_tokens: int | None, prompt_param: str) -> str:
    """OpenAI's message for a request beyond the model's context."""
    if max_tokens is None:
        return (f"This model's maximum context length is {context} tokens. However, your {prompt_param} resulted "
                f"in {prompt_tokens} tokens. Please reduce the length of the {prompt_param}.")
    in_prompt = "in the messages" if prompt_param == "messages" else "in the prompt"
    return (f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} {in_prompt}, {max_tokens} in the completion). "
            f"Please reduce the length of the {prompt_param} or completion.")


def fit_prompt(deployment: Deployment, prompt: str, *, max_tokens: int | None, default_max_tokens: int,
               truncate_prompt_tokens: int | None = None, prompt_param: str = "prompt",
               max_tokens_param: str = "max_tokens") -> FittedPrompt:
    """``prompt`` and the answer's length as the deployment can serve them whole; PromptRefused where they do not
    fit. ``max_tokens`` is what the request gave (None: left out, ``default_max_tokens`` then, lowered to fit);
    the params name the request's fields in the refusals."""
    context = context_length(deployment)
    if max_tokens is not None and max_tokens >= context:  # no room for even one token of prompt
        raise PromptRefused(_exceeded(context, _count(tokenizer_for(deployment), prompt), max_tokens, prompt_param),
                            max_tokens_param)
    tokenizer = tokenizer_for(deployment)
    if truncate_prompt_tokens is not None:
        keep = context if truncate_prompt_tokens == KEEP_ALL_THAT_FITS else truncate_prompt_tokens
        if not 1 <= keep <= context:
            raise PromptRefused(f"truncate_prompt_tokens value ({truncate_prompt_tokens}) is greater than the "
                                f"model's maximum context length ({context}): give 1 to {context}, or -1 for the "
                                f"context length", "truncate_prompt_tokens", "invalid_value")
        prompt, prompt_tokens = keep_last_tokens(tokenizer, prompt, keep)
        if not prompt:
            raise PromptRefused(f"truncate_prompt_tokens={truncate_prompt_tokens} keeps no text of the "
                                f"{prompt_param}: keep more tokens", "truncate_prompt_tokens", "invalid_value")
    else:
        prompt_tokens = _count(tokenizer, prompt)
    if max_tokens is None:
        answer = min(default_max_tokens, context - prompt_tokens)
        if answer < 1:
            raise PromptRefused(_exceeded(context, prompt_tokens, None, prompt_param), prompt_param)
        return FittedPrompt(prompt, prompt_tokens, answer)
    if prompt_tokens + max_tokens > context:
        raise PromptRefused(_exceeded(context, prompt_tokens, max_tokens, prompt_param), prompt_param)
    return FittedPrompt(prompt, prompt_tokens, max_tokens)
