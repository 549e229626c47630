"""A GPT-2 in the Hugging Face layout, imported as a checkpoint of this project.

    python -m deploy import-hf path/to/gpt2 runs/gpt2/checkpoints/step-0

reads ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and, when present, ``vocab.json`` +
``merges.txt``; it writes what a trained checkpoint holds, so generation and deployment read it like one:
``consolidated.safetensors`` (whole fp32 weights under the native names), ``tokenizer.json`` and, last,
``manifest.json`` (format ``consolidated``: weights only, step 0, no optimizer state to resume from).

GPT-2 is this project's GPT with GELU's tanh approximation, learned positions, biases and a tied head, so the
import is a renaming, with two twists of the Hugging Face files:
- their projections are ``Conv1D`` layers, y = x·W + b with W stored [in, out], where ``nn.Linear`` computes
  y = x·Wᵀ + b with W stored [out, in]: every projection weight is transposed;
- ``c_attn`` is q, k and v in one [C, 3C] projection: its output columns are split in three, in that order (each
  third lays its heads out as the native q, k, v do, head after head of D = C/H columns).
The causal-mask buffers some files carry (``attn.bias``, ``attn.masked_bias``) are not weights and are skipped; a
tied ``lm_head.weight`` is the token embedding again.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from tokenizers import ByteLevelBPETokenizer

from trainer.checkpoint.consolidated import write_consolidated
from trainer.contract import ModelSpec, ParallelPlan, SpecError
from trainer.contract.manifest import CONSOLIDATED, FORMAT_CONSOLIDATED, CheckpointManifest, read_manifest
from trainer.data.tokenizer import EOS, TOKENIZER, load_tokenizer
from trainer.model import GPT

log = logging.getLogger(__name__)

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
PYTORCH_BIN = "pytorch_model.bin"
VOCAB = "vocab.json"
MERGES = "merges.txt"

# Hugging Face's activation_function → ModelSpec.activation. "gelu_new" is the tanh formula written out, the same
# function as torch's approximate="tanh" ("gelu_pytorch_tanh").
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
LAYER_NORM_EPS = 1e-5  # torch's nn.LayerNorm default, which trainer.model keeps for every norm
# What transformers' GPT2Config assumes for a key config.json leaves out (GPT-2 small's shape).
GPT2_DEFAULTS: dict[str, Any] = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
                                 "vocab_size": 50257, "n_inner": None, "activation_function": "gelu_new",
                                 "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "scale_attn_weights": True,
                                 "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}
_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask tables older files saved beside the weights


class HFImportError(ValueError):
    """A folder that cannot be imported; the message says what was found and what to change."""


def import_hf_gpt2(source: Path, target: Path) -> Path:
    """Import the GPT-2 in folder ``source`` into checkpoint folder ``target`` (new or empty); return ``target``."""
    source, target = Path(source), Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise HFImportError(f"{target} exists and is not an empty folder: import into a new folder")
    spec = model_spec(read_config(source), name=source.name)
    state = native_state(load_hf_weights(source), spec)
    bpe = gpt2_tokenizer(source, spec.vocab_size)  # everything checked before the first file is written
    target.mkdir(parents=True, exist_ok=True)
    write_consolidated(state, target / CONSOLIDATED)
    tokenizer = ""
    if bpe is not None:
        bpe.save(str(target / TOKENIZER))
        load_tokenizer(target / TOKENIZER)  # as generation and deployment will read it
        tokenizer = str((target / TOKENIZER).resolve())
    # The manifest last: a folder without one is an import that did not finish, which nothing reads.
    CheckpointManifest(step=0, format=FORMAT_CONSOLIDATED, tokens_seen=0, model=spec.to_dict(),
                       plan=ParallelPlan().to_dict(), world_size=1, tokenizer=tokenizer, seed=0,
                       run=f"hf:{source.name}", consolidated=CONSOLIDATED).write(target)
    return target


def read_config(source: Path) -> dict[str, Any]:
    """config.json with transformers' GPT-2 defaults filled in; anything but a GPT-2 refused."""
    path = source / CONFIG
    if not path.is_file():
        raise HFImportError(f"{source} has no {CONFIG}: give the folder a Hugging Face model was saved to "
                            f"(save_pretrained writes {CONFIG} beside the weights)")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HFImportError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or config.get("model_type") != "gpt2":
        found = config.get("model_type") if isinstance(config, dict) else config
        raise HFImportError(f"{path} has model_type={found!r}: only GPT-2 (model_type 'gpt2') can be imported")
    return {**GPT2_DEFAULTS, **config}


def model_spec(config: dict[str, Any], name: str = "") -> ModelSpec:
    """The ModelSpec of a GPT-2 config: tanh or exact GELU, learned positions, biases, the head tied unless the
    config unties it. Refuses what trainer.model does not compute (naming the value and what it supports)."""
    activation = config["activation_function"]
    if activation not in ACTIVATIONS:
        raise HFImportError(f"activation_function={activation!r} is not supported: use one of "
                            f"{', '.join(map(repr, ACTIVATIONS))}")
    eps = config["layer_norm_epsilon"]
    if not isinstance(eps, (int, float)) or not math.isclose(eps, LAYER_NORM_EPS, rel_tol=1e-9):
        raise HFImportError(f"layer_norm_epsilon={eps!r} is not supported: this project's LayerNorm uses "
                            f"{LAYER_NORM_EPS} (GPT-2's value)")
    if not config["scale_attn_weights"] or config["scale_attn_by_inverse_layer_idx"]:
        raise HFImportError(f"scale_attn_weights={config['scale_attn_weights']!r}, scale_attn_by_inverse_layer_idx="
                            f"{config['scale_attn_by_inverse_layer_idx']!r} is not supported: attention here "
                            f"scales scores by 1/√head_dim only (true, false)")
    if config["add_cross_attention"]:
        raise HFImportError("add_cross_attention=true is not supported: this project's GPT is decoder-only")
    d_model, n_inner = config["n_embd"], config["n_inner"]
    try:
        return ModelSpec(n_layers=config["n_layer"], d_model=d_model, n_heads=config["n_head"],
                         seq_len=config["n_positions"], vocab_size=config["vocab_size"], name=name,
                         ffn_hidden=0 if n_inner in (None, 4 * d_model) else n_inner,
                         activation=ACTIVATIONS[activation], positions="learned", bias=True,
                         tied_embeddings=bool(config["tie_word_embeddings"])).validate()
    except (SpecError, TypeError) as exc:
        raise HFImportError(f"{CONFIG} describes no model this project can build: {exc}") from None


def load_hf_weights(source: Path) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors, else of pytorch_model.bin (read as plain tensors, no pickled code)."""
    if (source / SAFETENSORS).is_file():
        return load_file(str(source / SAFETENSORS))
    if (source / PYTORCH_BIN).is_file():
        return torch.load(source / PYTORCH_BIN, map_location="cpu", weights_only=True)
    found = sorted(p.name for p in source.iterdir())
    sharded = [n for n in found if n.endswith(".index.json")]
    hint = (f"{', '.join(sharded)} means sharded weights, which this import does not read: save the model as one "
            f"file (save_pretrained(..., max_shard_size='100GB'))" if sharded
            else "save the model with save_pretrained, or copy its weights file into the folder")
    raise HFImportError(f"{source} has no weights file ({SAFETENSORS} or {PYTORCH_BIN}); found "
                        f"{', '.join(found) or 'nothing'}: {hint}")


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 of ``spec`` holds, by its Hugging Face name (without ``transformer.``), with its shape
    as stored: Conv1D weights [in, out]."""
    C, F = spec.d_model, spec.ffn
    shapes = {"wte.weight": (spec.vocab_size, C), "wpe.weight": (spec.seq_len, C),
              "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(spec.n_layers):
        shapes.update({f"h.{i}.ln_1.weight": (C,), f"h.{i}.ln_1.bias": (C,),
                       f"h.{i}.attn.c_attn.weight": (C, 3 * C), f"h.{i}.attn.c_attn.bias": (3 * C,),
                       f"h.{i}.attn.c_proj.weight": (C, C), f"h.{i}.attn.c_proj.bias": (C,),
                       f"h.{i}.ln_2.weight": (C,), f"h.{i}.ln_2.bias": (C,),
                       f"h.{i}.mlp.c_fc.weight": (C, F), f"h.{i}.mlp.c_fc.bias": (F,),
                       f"h.{i}.mlp.c_proj.weight": (F, C), f"h.{i}.mlp.c_proj.bias": (C,)})
    if not spec.tied_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, C)
    return shapes


def checked_weights(hf: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The tensors of a GPT-2 of ``spec`` by their names without ``transformer.``, as fp32, after checking that
    exactly those are there with the shapes the config gives them."""
    weights = {}
    for name, tensor in hf.items():
        short = name.removeprefix("transformer.")
        if short.endswith(_BUFFERS) or (short == "lm_head.weight" and spec.tied_embeddings):
            continue
        weights[short] = tensor
    expected = hf_shapes(spec)
    shape_of = f"{CONFIG} (n_layer={spec.n_layers}, n_embd={spec.d_model}, n_positions={spec.seq_len}, " \
               f"vocab_size={spec.vocab_size}, n_inner={spec.ffn})"
    missing = [n for n in expected if n not in weights]
    unexpected = [n for n in weights if n not in expected]
    problems = ([f"missing {_few(missing)}"] if missing else []) + ([f"unexpected {_few(unexpected)}"]
                                                                      if unexpected else [])
    if problems:
        raise HFImportError(f"the weights do not match {shape_of}: {'; '.join(problems)}: give the config.json "
                            f"these weights were saved with")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise HFImportError(f"{name} has shape {list(weights[name].shape)} but {shape_of} gives it "
                                f"{list(shape)}: give the config.json these weights were saved with")
    return {name: t.to(torch.float32) for name, t in weights.items()}


def native_state(hf: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The native state dict (trainer.model.GPT's names) of Hugging Face GPT-2 tensors ``hf``: Conv1D weights
    transposed, c_attn split into q, k, v, the tied head the embedding itself."""
    w = checked_weights(hf, spec)
    C = spec.d_model
    state = {"embed.tokens.weight": w["wte.weight"], "embed.positions.weight": w["wpe.weight"]}
    for i in range(spec.n_layers):
        h, n = f"h.{i}.", f"layers.{i}."
        qkv_weight, qkv_bias = w[h + "attn.c_attn.weight"].t(), w[h + "attn.c_attn.bias"]  # [3C, C], [3C]
        for j, part in enumerate(("q", "k", "v")):
            state[f"{n}attn.{part}.weight"] = qkv_weight[j * C:(j + 1) * C].contiguous()
            state[f"{n}attn.{part}.bias"] = qkv_bias[j * C:(j + 1) * C].clone()  # a tensor of its own, not a view
        for hf_name, name in (("ln_1", "ln1"), ("ln_2", "ln2")):
            state[f"{n}{name}.weight"], state[f"{n}{name}.bias"] = w[f"{h}{hf_name}.weight"], w[f"{h}{hf_name}.bias"]
        for hf_name, name in (("attn.c_proj", "attn.out"), ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down")):
            state[f"{n}{name}.weight"] = w[f"{h}{hf_name}.weight"].t().contiguous()
            state[f"{n}{name}.bias"] = w[f"{h}{hf_name}.bias"]
    state["norm.weight"], state["norm.bias"] = w["ln_f.weight"], w["ln_f.bias"]
    state["head.weight"] = state["embed.tokens.weight"] if spec.tied_embeddings else w["lm_head.weight"]
    _check_native_names(state, spec)
    return state


def _check_native_names(state: dict[str, torch.Tensor], spec: ModelSpec) -> None:
    """The mapping above gives exactly the GPT's parameters their shapes (checked on the meta device: no memory)."""
    with torch.device("meta"):
        wanted = {name: tuple(t.shape) for name, t in GPT(spec).state_dict().items()}
    got = {name: tuple(t.shape) for name, t in state.items()}
    if got != wanted:
        raise RuntimeError(f"the GPT-2 → native mapping is out of step with trainer.model: {got} != {wanted}")


def gpt2_tokenizer(source: Path, model_vocab: int) -> ByteLevelBPETokenizer | None:
    """GPT-2's tokenizer from its vocab.json + merges.txt (byte-level BPE, no prefix space, <|endoftext|> the
    special token), as trainer.data.tokenizer trains its own; None when the folder has neither file."""
    vocab, merges = source / VOCAB, source / MERGES
    if not vocab.is_file() and not merges.is_file():
        log.warning("%s has no %s or %s: the weights are imported without a tokenizer (the manifest's tokenizer is "
                    "empty); copy GPT-2's tokenizer files into the folder and import again to have one",
                    source, VOCAB, MERGES)
        return None
    if not (vocab.is_file() and merges.is_file()):
        found, absent = (VOCAB, MERGES) if vocab.is_file() else (MERGES, VOCAB)
        raise HFImportError(f"{source} has {found} but no {absent}: a byte-level BPE tokenizer needs both "
                            f"(or neither, to import the weights alone)")
    bpe = ByteLevelBPETokenizer(vocab=str(vocab), merges=str(merges), add_prefix_space=False)
    bpe.add_special_tokens([EOS])  # GPT-2's vocab.json has it already: the token keeps its id
    if bpe.get_vocab_size() > model_vocab:
        raise HFImportError(f"the tokenizer has {bpe.get_vocab_size()} tokens but the model only "
                            f"vocab_size={model_vocab}: give the vocab.json and merges.txt of this model")
    return bpe


def summary(target: Path) -> dict[str, Any]:
    """What the CLI prints of an imported checkpoint, read back from what was written."""
    manifest = read_manifest(target)
    with safe_open(str(target / CONSOLIDATED), framework="pt") as f:
        parameters = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # a tied head once
    return {"target": str(target.resolve()), "parameters": parameters, "vocab_size": manifest.model["vocab_size"],
            "has_tokenizer": bool(manifest.tokenizer)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="folder of a Hugging Face GPT-2 (config.json and its weights)")
    parser.add_argument("target", type=Path, help="the checkpoint folder to write (new or empty)")


def run(args: argparse.Namespace) -> int:
    """Import a GPT-2 in the Hugging Face layout as a checkpoint folder; print one JSON line about it."""
    try:
        target = import_hf_gpt2(args.source, args.target)
    except HFImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary(target)))
    return 0


def _few(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
