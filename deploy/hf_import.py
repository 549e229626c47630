"""A model in the Hugging Face layout, imported as a checkpoint of this project.

    python -m deploy import-hf path/to/model runs/imported/checkpoints/step-0

GPT-2, Llama (Llama 3.1's rope scaling included), Qwen2, Mixtral and Qwen2-MoE (``deploy.hf_layout`` says what of
each is expressible, and refuses the rest naming the field). It reads:
- ``config.json``;
- the weights: ``model.safetensors``, or the shards ``model.safetensors.index.json`` lists (``pytorch_model.bin``
  and its sharded form too, read as plain tensors, no pickled code);
- the tokenizer: ``tokenizer.json``, else GPT-2's ``vocab.json`` + ``merges.txt``; ``tokenizer_config.json`` (its
  chat template, from it or from ``chat_template.jinja``, and its eos_token) is kept beside it;
- ``generation_config.json``, kept.
It writes what a trained checkpoint holds, so generation, training (``init_from``), deployment and ``export-hf``
read it like one: ``consolidated.safetensors`` (whole fp32 weights under the native names), ``tokenizer.json`` and
``tokenizer_config.json``, ``hf/`` (the source's config.json and generation_config.json and ``import.json``: the
weights' dtype, which export-hf writes back) and, last, ``manifest.json`` (format ``consolidated``: weights only,
step 0, no optimizer state to resume from). Routed experts are imported with capacity_factor 0 (no token dropped),
as transformers computes them. Everything is checked before the first file is written; the folder is built beside
the target and renamed into place.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from deploy.hf_layout import SKIPPED_SUFFIXES, LayoutError, hf_shapes, spec_from_config, tensor_layout
from deploy.outcome import report_outcome
from trainer.checkpoint.consolidated import write_consolidated
from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.manifest import CONSOLIDATED, FORMAT_CONSOLIDATED, CheckpointManifest, read_manifest
from trainer.data.tokenizer import EOS, TOKENIZER, load_tokenizer
from trainer.model import GPT

log = logging.getLogger(__name__)

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
PYTORCH_BIN_INDEX = "pytorch_model.bin.index.json"
VOCAB = "vocab.json"
MERGES = "merges.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 saves a chat template
GENERATION_CONFIG = "generation_config.json"
KEPT = "hf"                # the checkpoint's folder of what the source said that the weights do not
IMPORT_RECORD = "import.json"

Progress = Callable[[str], None]


class HFImportError(ValueError):
    """A folder that cannot be imported; the message says what was found and what to change."""


def import_hf(source: Path, target: Path, progress: Progress = log.info) -> Path:
    """Import the model in Hugging Face folder ``source`` into checkpoint folder ``target`` (new or empty); return
    ``target``. ``progress`` receives a line per step of the work."""
    source, target = Path(source), Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise HFImportError(f"{target} exists and is not an empty folder: import into a new folder")
    config = read_config(source)
    try:
        spec = spec_from_config(config, name=source.name)
    except LayoutError as exc:
        raise HFImportError(str(exc)) from None
    progress(f"{config['model_type']}: {spec.n_layers} layers, d_model {spec.d_model}, "
             f"{spec.n_experts or 'no'} experts, vocabulary {spec.vocab_size}")
    hf = load_hf_weights(source, progress)
    dtype = weights_dtype(hf)
    state = native_state(hf, spec, config["model_type"])
    del hf
    tokenizer = read_tokenizer(source, spec.vocab_size)  # everything checked before the first file is written
    tokenizer_config = read_tokenizer_config(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        progress(f"writing {CONSOLIDATED} ({len(state)} tensors)")
        write_consolidated(state, staging / CONSOLIDATED)
        has_tokenizer = tokenizer is not None
        if has_tokenizer:
            if (source / TOKENIZER).is_file():
                shutil.copy(source / TOKENIZER, staging / TOKENIZER)  # as it came: export-hf gives it back
            else:
                tokenizer.save(str(staging / TOKENIZER))
            if tokenizer_config is not None:
                (staging / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
            load_tokenizer(staging / TOKENIZER)  # as generation and deployment will read it
        kept = staging / KEPT
        kept.mkdir()
        shutil.copy(source / CONFIG, kept / CONFIG)
        if (source / GENERATION_CONFIG).is_file():
            shutil.copy(source / GENERATION_CONFIG, kept / GENERATION_CONFIG)
        (kept / IMPORT_RECORD).write_text(json.dumps({"dtype": dtype, "model_type": config["model_type"],
                                                      "source": source.name}, indent=2))
        staging.chmod(0o755)
        if target.exists():
            target.rmdir()  # empty, checked above
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # The manifest last, in place: a folder without one is an import that did not finish, which nothing reads.
    CheckpointManifest(step=0, format=FORMAT_CONSOLIDATED, tokens_seen=0, model=spec.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1,
                       tokenizer=str((target / TOKENIZER).resolve()) if has_tokenizer else "", seed=0,
                       run=f"hf:{source.name}", consolidated=CONSOLIDATED).write(target)
    progress(f"imported into {target}")
    return target


def import_hf_gpt2(source: Path, target: Path) -> Path:
    """A GPT-2 (any supported model, since the import reads each family): kept for callers of the first name."""
    return import_hf(source, target)


def read_config(source: Path) -> dict[str, Any]:
    path = source / CONFIG
    if not path.is_file():
        raise HFImportError(f"{source} has no {CONFIG}: give the folder a Hugging Face model was saved to "
                            f"(save_pretrained writes {CONFIG} beside the weights)")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HFImportError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise HFImportError(f"{path} holds {type(config).__name__}, not an object of settings")
    return config


def load_hf_weights(source: Path, progress: Progress = log.info) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors or of the shards its index lists; else of pytorch_model.bin (or its shards),
    read as plain tensors."""
    for single, index, read in ((SAFETENSORS, SAFETENSORS_INDEX, lambda p: load_file(str(p))),
                                (PYTORCH_BIN, PYTORCH_BIN_INDEX,
                                 lambda p: torch.load(p, map_location="cpu", weights_only=True))):
        if (source / single).is_file():
            progress(f"reading {single}")
            return read(source / single)
        if (source / index).is_file():
            files = shard_files(source, index)
            tensors: dict[str, torch.Tensor] = {}
            for n, name in enumerate(files, 1):
                progress(f"reading shard {n}/{len(files)} {name}")
                tensors.update(read(source / name))
            return tensors
    found = sorted(p.name for p in source.iterdir())
    raise HFImportError(f"{source} has no weights file ({SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH_BIN} or "
                        f"{PYTORCH_BIN_INDEX}); found {', '.join(found) or 'nothing'}: save the model with "
                        f"save_pretrained, or copy its weights files into the folder")


def shard_files(source: Path, index: str) -> list[str]:
    """The shard files an index's weight_map names, in order, each checked to be there."""
    try:
        weight_map = json.loads((source / index).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise HFImportError(f"{source / index} is not an index of shards (a weight_map of tensor → file): "
                            f"{exc}") from None
    missing = [name for name in files if not (source / name).is_file()]
    if missing:
        raise HFImportError(f"{index} lists {_few(missing)}, which {source} lacks: copy every shard")
    return files


def weights_dtype(hf: dict[str, torch.Tensor]) -> str:
    """The dtype most of the floating-point tensors have, as config.json names it ("bfloat16")."""
    counts = Counter(t.dtype for t in hf.values() if t.is_floating_point())
    dtype = counts.most_common(1)[0][0] if counts else torch.float32
    return str(dtype).removeprefix("torch.")


def native_state(hf: dict[str, torch.Tensor], spec: ModelSpec, model_type: str) -> dict[str, torch.Tensor]:
    """The native state dict (trainer.model.GPT's names, fp32) of Hugging Face tensors ``hf``, after checking that
    exactly the tensors of a ``model_type`` of ``spec`` are there with their shapes."""
    layout = tensor_layout(spec, model_type)
    native_shapes = _native_shapes(spec)
    _check_layout_covers_model(layout, native_shapes, spec)
    expected = hf_shapes(layout, native_shapes)
    weights = {}
    for name, tensor in hf.items():
        if model_type == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
            name = "transformer." + name  # old hub files: no prefix
        if name.endswith(SKIPPED_SUFFIXES) or (name == "lm_head.weight" and spec.tied_embeddings):
            continue
        weights[name] = tensor
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights if n not in expected]
    shape_of = f"{CONFIG} ({describe(spec)})"
    problems = ([f"missing {_few(missing)}"] if missing else []) + ([f"unexpected {_few(unexpected)}"]
                                                                      if unexpected else [])
    if problems:
        raise HFImportError(f"the weights do not match {shape_of}: {'; '.join(problems)}: give the config.json "
                            f"these weights were saved with")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise HFImportError(f"{name} has shape {list(weights[name].shape)} but {shape_of} gives it "
                                f"{list(shape)}: give the config.json these weights were saved with")
    state: dict[str, torch.Tensor] = {}
    for entry in layout:
        state.update(zip(entry.native, entry.to_native(weights[entry.hf].to(torch.float32))))
    if spec.tied_embeddings:
        state["head.weight"] = state["embed.tokens.weight"]
    return state


def describe(spec: ModelSpec) -> str:
    moe = f", n_experts={spec.n_experts}, moe_ffn={spec.moe_ffn}" if spec.is_moe else ""
    return (f"n_layers={spec.n_layers}, d_model={spec.d_model}, n_heads={spec.n_heads}, n_kv_heads={spec.kv_heads}, "
            f"seq_len={spec.seq_len}, vocab_size={spec.vocab_size}, ffn={spec.ffn}{moe}")


def _native_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in GPT(spec).state_dict().items()}


def _check_layout_covers_model(layout, native_shapes: dict[str, tuple[int, ...]], spec: ModelSpec) -> None:
    """The name table gives exactly trainer.model's parameters (checked on the meta device: no memory)."""
    covered = {n for entry in layout for n in entry.native} | ({"head.weight"} if spec.tied_embeddings else set())
    if covered != set(native_shapes):
        raise RuntimeError(f"deploy.hf_layout is out of step with trainer.model: the table lacks "
                           f"{sorted(set(native_shapes) - covered)} and has {sorted(covered - set(native_shapes))}")


def read_tokenizer(source: Path, model_vocab: int) -> Tokenizer | ByteLevelBPETokenizer | None:
    """The source's tokenizer.json, else its vocab.json + merges.txt as GPT-2's byte-level BPE (no prefix space,
    <|endoftext|> the special token); None when the folder has neither."""
    if (source / TOKENIZER).is_file():
        try:
            tokenizer = Tokenizer.from_file(str(source / TOKENIZER))
        except Exception as exc:  # the tokenizers library raises its own exception type
            raise HFImportError(f"{source / TOKENIZER} is not a tokenizer the tokenizers library reads: "
                                f"{exc}") from None
    else:
        vocab, merges = source / VOCAB, source / MERGES
        if not vocab.is_file() and not merges.is_file():
            log.warning("%s has no %s, %s or %s: the weights are imported without a tokenizer (the manifest's "
                        "tokenizer is empty); copy the model's tokenizer files into the folder and import again to "
                        "have one", source, TOKENIZER, VOCAB, MERGES)
            return None
        if not (vocab.is_file() and merges.is_file()):
            found, absent = (VOCAB, MERGES) if vocab.is_file() else (MERGES, VOCAB)
            raise HFImportError(f"{source} has {found} but no {absent}: a byte-level BPE tokenizer needs both "
                                f"(or neither, to import the weights alone)")
        tokenizer = ByteLevelBPETokenizer(vocab=str(vocab), merges=str(merges), add_prefix_space=False)
        tokenizer.add_special_tokens([EOS])  # GPT-2's vocab.json has it already: the token keeps its id
    if tokenizer.get_vocab_size() > model_vocab:
        raise HFImportError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but the model only "
                            f"vocab_size={model_vocab}: give the tokenizer files of this model")
    return tokenizer


def read_tokenizer_config(source: Path) -> dict[str, Any] | None:
    """tokenizer_config.json, with the chat template of chat_template.jinja folded in when it is kept apart
    (transformers 5); None when the source has neither."""
    config: dict[str, Any] | None = None
    if (source / TOKENIZER_CONFIG).is_file():
        try:
            config = json.loads((source / TOKENIZER_CONFIG).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HFImportError(f"{source / TOKENIZER_CONFIG} is not valid JSON: {exc}") from None
        if not isinstance(config, dict):
            raise HFImportError(f"{source / TOKENIZER_CONFIG} is not an object of settings")
    if (source / CHAT_TEMPLATE_FILE).is_file():
        config = {**(config or {}), "chat_template": (source / CHAT_TEMPLATE_FILE).read_text()}
    return config


def summary(target: Path) -> dict[str, Any]:
    """What the CLI prints of an imported checkpoint, read back from what was written."""
    manifest = read_manifest(target)
    with safe_open(str(target / CONSOLIDATED), framework="pt") as f:
        parameters = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # a tied head once
    kept = json.loads((target / KEPT / IMPORT_RECORD).read_text())
    chat = (target / TOKENIZER_CONFIG).is_file() and bool(json.loads((target / TOKENIZER_CONFIG).read_text())
                                                         .get("chat_template"))
    return {"target": str(target.resolve()), "model_type": kept["model_type"], "dtype": kept["dtype"],
            "parameters": parameters, "vocab_size": manifest.model["vocab_size"],
            "has_tokenizer": bool(manifest.tokenizer), "has_chat_template": chat}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="folder of a Hugging Face model (config.json and its weights)")
    parser.add_argument("target", type=Path, help="the checkpoint folder to write (new or empty)")


def run(args: argparse.Namespace) -> int:
    """Import a GPT-2, Llama, Qwen2, Mixtral or Qwen2-MoE in the Hugging Face layout as a checkpoint folder.

    Progress lines on stderr, one JSON line about the result on stdout; exit 2 when refused, 1 on a failure."""
    def progress(line: str) -> None:
        print(f"import-hf: {line}", file=sys.stderr, flush=True)

    return report_outcome("the import", lambda: summary(import_hf(args.source, args.target, progress)),
                          (HFImportError,))


def _few(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
