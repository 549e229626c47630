"""A checkpoint of this project written as a Hugging Face model folder, which transformers' from_pretrained loads.

    python -m deploy export-hf runs/<id>/checkpoints/step-<n> out/my-model [--max-shard-size 5GB] [--dtype bfloat16]

Any checkpoint of any plan and either engine (its whole fp32 weights come from trainer.checkpoint.consolidated) of a
spec some Hugging Face class computes exactly (``deploy.hf_layout``: GPT-2, Llama, Qwen2, Mixtral, Qwen2-MoE; others
are refused naming the field). It writes:
- the weights under Hugging Face's names, in ``--dtype`` (by default the dtype an imported model came in, else
  float32), as ``model.safetensors`` or, past ``--max-shard-size``, as ``model-0000i-of-0000n.safetensors`` shards
  with ``model.safetensors.index.json``; rotary q and k rows are put back in half-split order;
- ``config.json`` (an imported model's own, with every field the weights depend on written from the spec) and
  ``generation_config.json``;
- the tokenizer: ``tokenizer.json`` and ``tokenizer_config.json`` (an imported one's own, with its chat template;
  for this project's tokenizers one that names ``<|endoftext|>``), ``--chat-template`` to set a template.
The folder is built beside ``out`` and renamed into place, so ``out`` is never half written. Import → export gives
back the imported tensors bit for bit, in their dtype.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from deploy.hf_import import CONFIG, GENERATION_CONFIG, IMPORT_RECORD, KEPT, SAFETENSORS, SAFETENSORS_INDEX, \
    TOKENIZER_CONFIG
from deploy.hf_layout import LayoutError, config_from_spec, model_type_of, tensor_layout
from deploy.outcome import report_outcome
from deploy.staging import replace_folder
from trainer.checkpoint.consolidated import checkpoint_state
from trainer.contract.manifest import read_manifest
from trainer.data.tokenizer import EOS, TOKENIZER, load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_SHARD_SIZE = "5GB"
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30}
# Keys of an imported config.json that export-hf does not carry over: derived again from the spec (rotary settings
# in transformers 5's form, the per-layer attention kinds) or about the file rather than the model.
_DROPPED_KEYS = ("rope_parameters", "layer_types", "dtype", "transformers_version", "_name_or_path")

Progress = Callable[[str], None]


class HFExportError(ValueError):
    """A checkpoint or an option that cannot be exported; the message says what to change."""


def export_hf(checkpoint: Path, out: Path, max_shard_bytes: int = 5 * 10 ** 9, dtype: Optional[str] = None,
              overwrite: bool = False, chat_template: Optional[str] = None,
              progress: Progress = lambda line: None) -> dict[str, Any]:
    """Write checkpoint folder ``checkpoint`` as a Hugging Face model folder ``out``; return what was written
    (target, model_type, dtype, shards, parameters, notes)."""
    checkpoint, out = Path(checkpoint), Path(out)
    manifest = read_manifest(checkpoint)
    if manifest is None:
        raise HFExportError(f"{checkpoint} has no manifest.json: give a complete checkpoint folder "
                            f"(runs/<id>/checkpoints/step-<n>)")
    if out.exists() and not overwrite:
        raise HFExportError(f"{out} exists: give a new folder, or --overwrite to replace it")
    spec = manifest.model_spec()
    imported = _read_json(checkpoint / KEPT / IMPORT_RECORD) or {}
    dtype = dtype or imported.get("dtype") or "float32"
    if dtype not in DTYPES:
        raise HFExportError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    try:
        model_type = model_type_of(spec)
        config, notes = config_from_spec(spec, dtype)
    except LayoutError as exc:
        raise HFExportError(str(exc)) from None
    tokenizer_path = Path(manifest.tokenizer) if manifest.tokenizer else None
    if tokenizer_path is not None and not tokenizer_path.is_file():
        notes.append(f"the checkpoint's tokenizer {tokenizer_path} is gone: written without a tokenizer")
        tokenizer_path = None
    elif tokenizer_path is None:
        notes.append("the checkpoint has no tokenizer: written without one")

    progress(f"reading {checkpoint} ({manifest.format}, saved by {manifest.world_size} rank(s))")
    state = checkpoint_state(checkpoint, manifest)
    progress(f"converting to {model_type} tensors in {dtype}")
    weights = {entry.hf: entry.to_hf([state[n] for n in entry.native]).to(DTYPES[dtype]).contiguous()
               for entry in tensor_layout(spec, model_type)}
    del state
    kept_config = _read_json(checkpoint / KEPT / CONFIG)
    token_config, token_ids = _tokenizer_config(tokenizer_path, spec.seq_len, chat_template)
    config = _merged_config(kept_config, config, token_ids)
    generation = _read_json(checkpoint / KEPT / GENERATION_CONFIG) or \
        {k: v for k, v in token_ids.items() if v is not None}

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        shards = write_shards(weights, staging, max_shard_bytes, progress)
        _write_json(staging / CONFIG, config)
        _write_json(staging / GENERATION_CONFIG, generation)
        if tokenizer_path is not None:
            shutil.copy(tokenizer_path, staging / TOKENIZER)
            _write_json(staging / TOKENIZER_CONFIG, token_config)
        staging.chmod(0o755)
        replace_folder(out, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for note in notes:
        progress(f"note: {note}")
    progress(f"wrote {out}")
    return {"target": str(out.resolve()), "model_type": model_type, "dtype": dtype, "shards": shards,
            "parameters": sum(t.numel() for t in weights.values()), "has_tokenizer": tokenizer_path is not None,
            "notes": notes}


def write_shards(weights: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int,
                 progress: Progress = lambda line: None) -> int:
    """The tensors in files of at most ``max_shard_bytes`` each (a larger tensor alone in its own), in the model's
    order: one model.safetensors, or shards and their index as save_pretrained writes them. Returns the count."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, tensor in weights.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    if len(groups) == 1:
        progress(f"writing {SAFETENSORS}")
        save_file({n: weights[n] for n in groups[0]}, str(folder / SAFETENSORS), metadata={"format": "pt"})
        return 1
    weight_map = {}
    for i, group in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        progress(f"writing shard {i}/{len(groups)} {name}")
        save_file({n: weights[n] for n in group}, str(folder / name), metadata={"format": "pt"})
        weight_map.update({n: name for n in group})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    _write_json(folder / SAFETENSORS_INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return len(groups)


def _merged_config(kept: Optional[dict[str, Any]], derived: dict[str, Any],
                   token_ids: dict[str, Optional[int]]) -> dict[str, Any]:
    """An imported model's config.json (when of the same model_type) under the fields derived from the spec; the
    token ids from the tokenizer where neither gives them."""
    base = {}
    if kept and kept.get("model_type") == derived["model_type"]:
        base = {k: v for k, v in kept.items() if k not in _DROPPED_KEYS}
    config = {**base, **derived}
    for key, value in token_ids.items():
        if config.get(key) is None and value is not None:
            config[key] = value
    return config


def _tokenizer_config(tokenizer_path: Optional[Path], seq_len: int,
                      chat_template: Optional[str]) -> tuple[dict[str, Any], dict[str, Optional[int]]]:
    """(tokenizer_config.json, the bos/eos token ids): the one kept beside an imported tokenizer, else one for this
    project's byte-level BPE, whose <|endoftext|> ends and begins texts."""
    if tokenizer_path is None:
        return {}, {"bos_token_id": None, "eos_token_id": None}
    config = _read_json(tokenizer_path.parent / TOKENIZER_CONFIG)
    tokenizer = load_tokenizer(tokenizer_path)
    if config is None:
        eos = EOS if tokenizer.eos_id is not None else None
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": seq_len, "bos_token": eos,
                  "eos_token": eos, "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        config = {**config, "chat_template": chat_template}
    bos = config.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    bos_id = Tokenizer.from_file(str(tokenizer_path)).token_to_id(bos) if isinstance(bos, str) else None
    return config, {"bos_token_id": bos_id, "eos_token_id": tokenizer.eos_id}


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def parse_size(text: str) -> int:
    """'5GB', '500MB', '64KiB' or a number of bytes → bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 5GB, 500MB, 64KiB or a byte count")
    value = float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is under one byte")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="a checkpoint folder (runs/<id>/checkpoints/step-<n>)")
    parser.add_argument("out", type=Path, help="the Hugging Face model folder to write (new, or --overwrite)")
    parser.add_argument("--max-shard-size", type=parse_size, default=parse_size(DEFAULT_SHARD_SIZE),
                        help=f"largest weights file; more weights go into numbered shards with an index "
                             f"(default {DEFAULT_SHARD_SIZE})")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                        help="the weights' dtype (default: an imported model's own, else float32)")
    parser.add_argument("--chat-template", type=Path, default=None,
                        help="a Jinja chat template file to put in tokenizer_config.json")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder at OUT")


def run(args: argparse.Namespace) -> int:
    """Export a checkpoint as a Hugging Face model folder that transformers' from_pretrained loads.

    Progress lines on stderr, one JSON line about the result on stdout; exit 2 when refused, 1 on a failure."""
    def progress(line: str) -> None:
        print(f"export-hf: {line}", file=sys.stderr, flush=True)

    def work() -> dict:
        try:
            template = args.chat_template.read_text() if args.chat_template is not None else None
        except (OSError, UnicodeDecodeError) as exc:
            raise HFExportError(f"cannot read the chat template {args.chat_template}: {exc}") from exc
        return export_hf(args.checkpoint, args.out, args.max_shard_size, args.dtype, args.overwrite, template,
                         progress)

    return report_outcome("the export", work, (HFExportError,))
