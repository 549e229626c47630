"""The tokenizer as the trainer, generation and deployment use it: byte-level BPE with one special token.

Deployment reads a checkpoint's tokenizer through ``load_tokenizer`` alone, without the rest of the data package.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from tokenizers import ByteLevelBPETokenizer, Tokenizer

from trainer.data.errors import DataError

EOS = "<|endoftext|>"
SPECIALS = (EOS,)
BYTE_ALPHABET = 256
MIN_VOCAB = BYTE_ALPHABET + len(SPECIALS)
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"  # Hugging Face's, beside an imported tokenizer.json: names its eos_token
# End-of-text tokens of the model families a checkpoint may be imported from, for a tokenizer without ours and
# without a tokenizer_config.json that names one (Llama 3 base, Llama 2 / Mistral / Mixtral, Qwen2 chat)
FOREIGN_EOS = ("<|end_of_text|>", "</s>", "<|im_end|>")


class TextTokenizer:
    """A trained tokenizer as the trainer and the deployment use it: text ↔ ids, nothing else."""

    def __init__(self, tokenizer, eos: str = EOS):
        self._tok = tokenizer
        # None only for a foreign tokenizer with no end-of-text token known here
        self.eos_id: int | None = next((i for t in (eos, EOS, *FOREIGN_EOS)
                                        if (i := tokenizer.token_to_id(t)) is not None), None)
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
    return TextTokenizer(Tokenizer.from_file(str(path)), _configured_eos(path.parent / TOKENIZER_CONFIG))


# GPT-2's own files: what a tokenizer from before tokenizer.json comes as
GPT2_VOCAB, GPT2_MERGES = "vocab.json", "merges.txt"
CONVERTED = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llm-workbench" / "tokenizers"


def resolve_tokenizer(path: Path) -> Path:
    """The tokenizer.json an existing tokenizer is read from: the file itself, the one in a folder, or, for a
    folder of GPT-2's vocab.json and merges.txt, a tokenizer.json made from them once (kept by their content under
    ``CONVERTED``, with the folder's tokenizer_config.json beside it)."""
    if path.is_file():
        return path
    if (path / TOKENIZER).is_file():
        return path / TOKENIZER
    vocab, merges = path / GPT2_VOCAB, path / GPT2_MERGES
    if not (vocab.is_file() and merges.is_file()):
        raise DataError(f"no tokenizer at {path}: give a tokenizer.json, or a folder with one or with GPT-2's "
                        f"{GPT2_VOCAB} and {GPT2_MERGES}")
    digest = hashlib.sha256(vocab.read_bytes() + b"\0" + merges.read_bytes()).hexdigest()[:16]
    target = CONVERTED / digest / TOKENIZER
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tok = ByteLevelBPETokenizer(str(vocab), str(merges), add_prefix_space=False)
        # GPT-2's end-of-text is in its vocabulary; as a special token it is never split
        tok.add_special_tokens([t for t in (EOS,) if tok.token_to_id(t) is not None])
        tmp = target.with_name(f".{TOKENIZER}.{os.getpid()}")
        tok.save(str(tmp))
        if (path / TOKENIZER_CONFIG).is_file():
            shutil.copyfile(path / TOKENIZER_CONFIG, target.parent / TOKENIZER_CONFIG)
        os.replace(tmp, target)
    return target


def _configured_eos(config: Path) -> str:
    """The eos_token a Hugging Face tokenizer_config.json beside the tokenizer names (a string, or an added token's
    {"content": ...}); ours when there is none."""
    try:
        eos = json.loads(config.read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return EOS
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else EOS


def train_tokenizer(pieces: Iterator[str], vocab_size: int):
    # add_prefix_space=False keeps decoding exact; all 256 bytes are in the initial alphabet, so any text encodes.
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(pieces, vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
                            show_progress=False)
    return tok
