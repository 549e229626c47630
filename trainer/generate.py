"""Text generation from a checkpoint with a KV cache: greedy, temperature, top-k and top-p (nucleus) sampling.

    python -m trainer.generate --checkpoint runs/<id>/checkpoints/step-<n> --prompt "ROMEO:" --max-new-tokens 50

``load_model_from_checkpoint`` reads a checkpoint of any plan and either engine into one unsharded model
(trainer.checkpoint.consolidated);
``generate`` and ``generate_stream`` are what a serving backend calls. Each new token costs one forward over
one position: the keys and values of earlier positions are kept per block (``KVCache``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch

from trainer.checkpoint.consolidated import checkpoint_state, empty_model
from trainer.contract.manifest import read_manifest
from trainer.data.tokenizer import load_tokenizer
from trainer.model import GPT, KVCache


def load_model_from_checkpoint(path: str | Path, device: str | torch.device = "cpu",
                               dtype: torch.dtype = torch.float32):
    """(model in eval mode, tokenizer or None) from a checkpoint folder ``checkpoints/step-<n>`` of any plan."""
    folder = Path(path)
    manifest = read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no manifest.json: not a complete checkpoint")
    model = empty_model(manifest.model_spec())  # no time spent on random weights that the checkpoint replaces
    model.load_state_dict(checkpoint_state(folder))
    model.to(device=device, dtype=dtype).eval()
    tokenizer = load_tokenizer(manifest.tokenizer) if manifest.tokenizer and Path(manifest.tokenizer).is_file() \
        else None
    return model, tokenizer


def _pick(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
          gen: Optional[torch.Generator]) -> torch.Tensor:
    """Next token id (B,) from last-position logits (B, V)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        # Keep the smallest set of most likely tokens whose probabilities sum to at least top_p.
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_logits.softmax(dim=-1) >= top_p  # tokens after the set is already full
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def generate_stream(model: GPT, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0, seed: Optional[int] = None,
                    eos_id: Optional[int] = None) -> Iterator[int]:
    """Yield new token ids one at a time. temperature 0 is greedy. The context is cut to the model's seq_len."""
    if not prompt_ids:
        raise ValueError("generation needs at least one prompt token")
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    limit = model.spec.seq_len
    ids = list(prompt_ids)[-limit:]
    cache = KVCache()
    logits = model(torch.tensor([ids], device=device), cache)[:, -1]
    for _ in range(max_new_tokens):
        nxt = int(_pick(logits, temperature, top_k, top_p, gen)[0])
        yield nxt
        if eos_id is not None and nxt == eos_id:
            return
        ids.append(nxt)
        if cache.length() >= limit:  # the window is full: start a fresh cache over the last seq_len - 1 tokens
            cache = KVCache()
            ids = ids[-(limit - 1):]
            logits = model(torch.tensor([ids], device=device), cache)[:, -1]
        else:
            logits = model(torch.tensor([[nxt]], device=device), cache)[:, -1]


def generate(model: GPT, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, seed: Optional[int] = None,
             eos_id: Optional[int] = None) -> list[int]:
    """prompt_ids followed by up to max_new_tokens generated ids."""
    return list(prompt_ids) + list(generate_stream(model, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                                   seed, eos_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoints/step-<n> folder")
    parser.add_argument("--prompt", default="\n")
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    model, tok = load_model_from_checkpoint(args.checkpoint)
    if tok is None:
        print("error: the checkpoint's tokenizer is missing", file=sys.stderr)
        return 2
    sys.stdout.write(args.prompt)
    new: list[int] = []
    shown = ""
    for token in generate_stream(model, tok.encode(args.prompt), args.max_new_tokens, args.temperature,
                                 args.top_k, args.top_p, args.seed, tok.eos_id):
        new.append(token)
        text = tok.decode(new)
        if not text.endswith("\ufffd"):  # a byte-level token may end mid-character: wait for the rest
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
