"""The tokenizer as the trainer, generation and deployment use it: byte-level BPE with one special token.

Deployment reads a checkpoint's tokenizer through ``load_tokenizer`` alone, without the rest of the data package.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from tokenizers import ByteLevelBPETokenizer, Tokenizer

from trainer.data.errors import DataError

EOS = "<|endoftext|>"
SPECIALS = (EOS,)
BYTE_ALPHABET = 256
MIN_VOCAB = BYTE_ALPHABET + len(SPECIALS)
TOKENIZER = "tokenizer.json"


class TextTokenizer:
    """A trained tokenizer as the trainer and the deployment use it: text ↔ ids, nothing else."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.eos_id: int = tokenizer.token_to_id(EOS)
        self.vocab_size: int = tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        # Special tokens are kept, so decode(encode(text)) == text for any text.
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def load_tokenizer(path: str | os.PathLike) -> TextTokenizer:
    """The tokenizer.json of a prepared dataset (or a checkpoint) as a TextTokenizer."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER
    if not path.is_file():
        raise DataError(f"no tokenizer at {path}: prepare the dataset first (python -m trainer.data prepare ...)")
    return TextTokenizer(Tokenizer.from_file(str(path)))


def train_tokenizer(pieces: Iterator[str], vocab_size: int):
    # add_prefix_space=False keeps decoding exact; all 256 bytes are in the initial alphabet, so any text encodes.
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(pieces, vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
                            show_progress=False)
    return tok
