"""The files of an exported model's version folder, as the exporter writes them and the server reads them.

    <model>/config.pbtxt
    <model>/1/model.py                      the Triton Python-backend model
    <model>/1/workbench_serving/            this package
    <model>/1/model_spec.json               the trainer's ModelSpec as JSON
    <model>/1/serving.json                  tensor_parallel, reduction, what the export measured
    <model>/1/weights/rank-<r>.safetensors  rank r's tensor-parallel shard (rank-0 holds all with one rank)
    <model>/1/tokenizer.json
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

MODEL_SPEC, SERVING, TOKENIZER, WEIGHTS = "model_spec.json", "serving.json", "tokenizer.json", "weights"
EOS = "<|endoftext|>"


def shard_file(folder: Path, rank: int) -> Path:
    return Path(folder) / WEIGHTS / f"rank-{rank}.safetensors"


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def load_shard(folder: Path, rank: int) -> dict[str, torch.Tensor]:
    return load_file(str(shard_file(folder, rank)))


class Codec:
    """Text ↔ token ids with the checkpoint's tokenizer; special tokens kept, so decoding is exact."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.eos_id = self._tok.token_to_id(EOS)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)
