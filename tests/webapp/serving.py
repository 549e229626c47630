"""Helpers of the serving tests (web and workers): a port nothing listens on, checkpoint folders, deployments."""
from __future__ import annotations

import socket
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.manifest import CheckpointManifest
from webapp import models

# n_heads 4 and MLP width 512: tensor parallel 1, 2 or 4 divide it, 3 does not
SMALL_MODEL = ModelSpec(name="small", n_layers=2, d_model=128, n_heads=4, seq_len=64, vocab_size=512)


@contextmanager
def refusing_port():
    """A port bound by this process but never listened on: connecting to it is refused at once, and no other
    server of the session can take it while the socket is open."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@lru_cache(maxsize=1)
def byte_tokenizer_json() -> str:
    """A byte-level tokenizer without merges: every byte of the UTF-8 text is one token (and <|endoftext|> one), so
    a test knows a prompt's count from its length."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: index for index, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    return tokenizer.to_str()


def checkpoint_folder(folder: Path, tokenizer: bool = True, model: ModelSpec = SMALL_MODEL) -> Path:
    """A folder holding a checkpoint's manifest.json (and a tokenizer file, byte_tokenizer_json), no weights: enough
    to register."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer_path = ""
    if tokenizer:
        (folder / "tokenizer.json").write_text(byte_tokenizer_json())
        tokenizer_path = str(folder / "tokenizer.json")
    CheckpointManifest(step=7, format="consolidated", tokens_seen=1000, model=model.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer=tokenizer_path, seed=0).write(folder)
    return folder


def imported(owner, folder: Path) -> models.Checkpoint:
    """``folder``'s checkpoint, registered as ``owner``'s import (without the path checks of the API)."""
    from trainer.contract.manifest import read_manifest
    manifest = read_manifest(folder)
    return models.Checkpoint.objects.create(owner=owner, name=folder.name, step=manifest.step, path=str(folder),
                                            manifest=manifest.to_dict())


def deployment(owner, checkpoint, server, model_name: str = "small", status: str = "ready",
               **fields) -> models.Deployment:
    return models.Deployment.objects.create(owner=owner, checkpoint=checkpoint, server=server,
                                            model_name=model_name, status=status, **fields)
