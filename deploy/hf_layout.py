"""The Hugging Face layout of the model families this project computes, in both directions: config.json ↔ ModelSpec,
and each tensor's Hugging Face name ↔ its native name(s), with the exact transform between them.

    GPT-2      (model_type gpt2)       LayerNorm, GELU, learned positions, biases
    Llama      (llama)                 RMSNorm, SwiGLU, rotary positions (Llama 3.1's rope scaling), grouped-query
    Qwen2      (qwen2)                 Llama's blocks with biases on q, k and v only
    Mixtral    (mixtral)               Llama's blocks with routed SwiGLU experts on every layer, top-k renormalised
    Qwen2-MoE  (qwen2_moe)             Qwen2's blocks with routed experts and a shared expert behind a sigmoid gate

``deploy.hf_import`` and ``deploy.hf_export`` both read the one table ``tensor_layout`` makes, so a name or a
transform is written once and the two directions cannot drift apart. Every transform is exact (a transpose, a split
or a concatenation, a permutation of rows), so import → export gives back the same tensors bit for bit:
- GPT-2's projections are ``Conv1D`` (weights stored [in, out]): transposed; its ``c_attn`` holds q, k and v in one
  projection: split in three (its output columns, each third head after head);
- rotary positions: Hugging Face's Llama family rotates the halves (x[i], x[i+D/2]) of each head, this project's
  model the adjacent pairs (x[2i], x[2i+1]); the rows of q and k (weights, and Qwen2's biases) are permuted per head
  from half-split to interleaved order on import, and back on export.
A config this project cannot compute is refused with the field that says so (``LayoutError``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from deploy.hf_classes import ARCHITECTURES, MODEL_TYPES, LayoutError, model_type_of  # noqa: F401 (re-exported)
from trainer.contract import ModelSpec, RopeScaling, SpecError

# Hugging Face's activation_function → ModelSpec.activation. "gelu_new" is the tanh formula written out, the same
# function as torch's approximate="tanh" ("gelu_pytorch_tanh").
GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

# What transformers' config classes assume for a key config.json leaves out.
DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257, "n_inner": None,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
             "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 2048, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
              "mlp_bias": False},
    "qwen2": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 32768, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "use_sliding_window": False},
    "mixtral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 1e6, "tie_word_embeddings": False,
                "sliding_window": None, "num_local_experts": 8, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.001},
    "qwen2_moe": {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 32768,
                  "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                  "use_sliding_window": False, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
                  "norm_topk_prob": False, "mlp_only_layers": [], "qkv_bias": True, "router_aux_loss_coef": 0.001},
}
# Keys older files carry beside the weights that are no weights (causal-mask tables, rotary frequencies).
SKIPPED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


# ---------------------------------------------------------------------------------------------------------------------
# config.json → ModelSpec

def spec_from_config(config: dict[str, Any], name: str = "") -> ModelSpec:
    """The ModelSpec of a Hugging Face config.json (as a dict); a model this project cannot compute is refused."""
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise LayoutError(f"model_type={model_type!r} cannot be imported: supported are "
                          f"{', '.join(map(repr, ARCHITECTURES))}")
    c = {**DEFAULTS[model_type], **{k: v for k, v in config.items() if v is not None or k == "sliding_window"}}
    fields = _gpt2_fields(c) if model_type == "gpt2" else _llama_fields(model_type, c)
    try:
        return ModelSpec(name=name, **fields).validate()
    except (SpecError, TypeError) as exc:
        raise LayoutError(f"config.json describes no model this project can build: {exc}") from None


def _gpt2_fields(c: dict[str, Any]) -> dict[str, Any]:
    activation = c["activation_function"]
    if activation not in GPT2_ACTIVATIONS:
        raise LayoutError(f"activation_function={activation!r} is not supported: use one of "
                          f"{', '.join(map(repr, GPT2_ACTIVATIONS))}")
    if not c["scale_attn_weights"] or c["scale_attn_by_inverse_layer_idx"]:
        raise LayoutError(f"scale_attn_weights={c['scale_attn_weights']!r}, scale_attn_by_inverse_layer_idx="
                          f"{c['scale_attn_by_inverse_layer_idx']!r} is not supported: attention here scales scores "
                          f"by 1/√head_dim only (true, false)")
    if c["add_cross_attention"]:
        raise LayoutError("add_cross_attention=true is not supported: this project's GPT is decoder-only")
    d_model, n_inner = c["n_embd"], c["n_inner"]
    return dict(n_layers=c["n_layer"], d_model=d_model, n_heads=c["n_head"], seq_len=c["n_positions"],
                vocab_size=c["vocab_size"], ffn_hidden=0 if n_inner in (None, 4 * d_model) else n_inner,
                activation=GPT2_ACTIVATIONS[activation], positions="learned", norm="layernorm",
                norm_eps=float(c["layer_norm_epsilon"]), bias=True, tied_embeddings=bool(c["tie_word_embeddings"]))


def _llama_fields(model_type: str, c: dict[str, Any]) -> dict[str, Any]:
    if c["hidden_act"] != "silu":
        raise LayoutError(f"hidden_act={c['hidden_act']!r} is not supported: the SwiGLU MLP here uses 'silu'")
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim")
    if head_dim is not None and heads and head_dim * heads != c["hidden_size"]:
        raise LayoutError(f"head_dim={head_dim} is not hidden_size/num_attention_heads={c['hidden_size']}/{heads}: "
                          f"this project's attention uses d_model/n_heads per head")
    _refuse_sliding_window(model_type, c)
    rope_base, rope_scaling = _rope(c)
    kv_heads = c.get("num_key_value_heads") or heads
    # Fields in the presets' canonical form (0 for as many key/value heads as heads, None for a bias that follows
    # ``bias``), so an imported model compares equal to the preset of its shape (a run's init_from check).
    fields = dict(n_layers=c["num_hidden_layers"], d_model=c["hidden_size"], n_heads=heads,
                  n_kv_heads=0 if kv_heads == heads else kv_heads, seq_len=c["max_position_embeddings"],
                  vocab_size=c["vocab_size"], ffn_hidden=c["intermediate_size"], positions="rope",
                  activation="swiglu", norm="rmsnorm", norm_eps=float(c["rms_norm_eps"]), rope_base=float(rope_base),
                  rope_scaling=rope_scaling, tied_embeddings=bool(c["tie_word_embeddings"]), bias=False)
    if model_type == "llama":
        fields.update(attention_bias=True if c["attention_bias"] else None, mlp_bias=True if c["mlp_bias"] else None)
    elif model_type == "qwen2":
        fields.update(qkv_bias=True)
    elif model_type == "mixtral":
        fields.update(n_experts=c["num_local_experts"], top_k=c["num_experts_per_tok"], topk_norm="renormalize",
                      capacity_factor=0.0, aux_loss_coef=float(c["router_aux_loss_coef"]))
    else:
        fields.update(_qwen2_moe_fields(c))
    return fields


def _qwen2_moe_fields(c: dict[str, Any]) -> dict[str, Any]:
    n_layers, step = c["num_hidden_layers"], c["decoder_sparse_step"]
    shared = c["shared_expert_intermediate_size"]
    if not shared:
        raise LayoutError("shared_expert_intermediate_size=0 is not supported: Qwen2-MoE's shared expert is then "
                          "an empty MLP behind a gate; give the model's shared expert width")
    if not isinstance(step, int) or step < 1:
        raise LayoutError(f"decoder_sparse_step={step!r} must be a positive integer")
    dense_only = set(c["mlp_only_layers"] or ())
    theirs = {i for i in range(n_layers) if i not in dense_only and (i + 1) % step == 0}
    # ours: layers past first_dense_layers, every moe_every-th counting from 1; find the first_dense_layers that
    # gives the same layers, if one does
    first = next((k for k in range(n_layers + 1)
                  if {i for i in range(k, n_layers) if (i + 1) % step == 0} == theirs), None)
    if first is None or not theirs:
        raise LayoutError(f"mlp_only_layers={sorted(dense_only)} with decoder_sparse_step={step} is not supported: "
                          f"the dense layers here are the first few (first_dense_layers) and then every layer not a "
                          f"multiple of moe_every; experts would be on layers {sorted(theirs)}")
    return dict(qkv_bias=True if c["qkv_bias"] else None, n_experts=c["num_experts"],
                top_k=c["num_experts_per_tok"], topk_norm="renormalize" if c["norm_topk_prob"] else "none",
                moe_ffn_hidden=c["moe_intermediate_size"], shared_expert_ffn=shared, shared_expert_gate=True,
                moe_every=step, first_dense_layers=first, capacity_factor=0.0,
                aux_loss_coef=float(c["router_aux_loss_coef"]))


def _refuse_sliding_window(model_type: str, c: dict[str, Any]) -> None:
    if c.get("use_sliding_window"):
        raise LayoutError(f"use_sliding_window=true is not supported: attention here sees every earlier position; "
                          f"set it to false (sliding_window={c.get('sliding_window')!r})")
    if model_type in ("mixtral", "llama") and c.get("sliding_window") is not None:
        raise LayoutError(f"sliding_window={c['sliding_window']!r} is not supported: attention here sees every "
                          f"earlier position; set it to null")
    kinds = set(c.get("layer_types") or ()) - {"full_attention"}
    if kinds:
        raise LayoutError(f"layer_types has {', '.join(sorted(kinds))}: only full_attention is supported")


def _rope(c: dict[str, Any]) -> tuple[float, Optional[RopeScaling]]:
    """(rope_base, rope_scaling) from transformers 4's rope_theta + rope_scaling or 5's rope_parameters."""
    parameters = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    theta = parameters.get("rope_theta", c.get("rope_theta"))
    scaling = c.get("rope_scaling") if isinstance(c.get("rope_scaling"), dict) else parameters
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    partial = scaling.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise LayoutError(f"partial_rotary_factor={partial!r} is not supported: rotary positions here turn the whole "
                          f"head (1.0)")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise LayoutError(f"rope_scaling.rope_type={kind!r} is not supported: use 'default' or 'llama3' "
                          f"(Llama 3.1's scaling)")
    try:
        return theta, RopeScaling(factor=float(scaling["factor"]), low_freq_factor=float(scaling["low_freq_factor"]),
                                  high_freq_factor=float(scaling["high_freq_factor"]),
                                  original_max_positions=int(scaling["original_max_position_embeddings"]))
    except KeyError as exc:
        raise LayoutError(f"rope_scaling of rope_type 'llama3' lacks {exc.args[0]}") from None


# ---------------------------------------------------------------------------------------------------------------------
# ModelSpec → config.json

def config_from_spec(spec: ModelSpec, dtype: str) -> tuple[dict[str, Any], list[str]]:
    """(config.json of the Hugging Face model computing what ``spec`` computes, notes on what differs in training
    only); a spec no Hugging Face class computes exactly is refused with the field that stops it."""
    model_type = model_type_of(spec)
    notes = []
    if spec.is_moe and spec.capacity_factor > 0:
        notes.append(f"capacity_factor={spec.capacity_factor}: transformers routes every token (no capacity), as "
                     f"this model does with capacity_factor 0; where training dropped tokens the logits differ")
    common = {"architectures": [ARCHITECTURES[model_type]], "model_type": model_type, "torch_dtype": dtype,
              "vocab_size": spec.vocab_size, "tie_word_embeddings": spec.tied_embeddings, "use_cache": True,
              "initializer_range": 0.02}
    if model_type == "gpt2":
        activation = "gelu_new" if spec.activation == "gelu_tanh" else "gelu"
        return {**common, "n_layer": spec.n_layers, "n_embd": spec.d_model, "n_head": spec.n_heads,
                "n_positions": spec.seq_len, "n_ctx": spec.seq_len, "n_inner": spec.ffn,
                "activation_function": activation, "layer_norm_epsilon": spec.norm_eps, "resid_pdrop": spec.dropout,
                "embd_pdrop": spec.dropout, "attn_pdrop": spec.dropout, "scale_attn_weights": True}, notes
    rope_scaling = None if spec.rope_scaling is None else {
        "rope_type": "llama3", "factor": spec.rope_scaling.factor, "low_freq_factor": spec.rope_scaling.low_freq_factor,
        "high_freq_factor": spec.rope_scaling.high_freq_factor,
        "original_max_position_embeddings": spec.rope_scaling.original_max_positions}
    config = {**common, "hidden_size": spec.d_model, "intermediate_size": spec.ffn,
              "num_hidden_layers": spec.n_layers, "num_attention_heads": spec.n_heads,
              "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
              "max_position_embeddings": spec.seq_len, "hidden_act": "silu", "rms_norm_eps": spec.norm_eps,
              "rope_theta": spec.rope_base, "rope_scaling": rope_scaling, "attention_dropout": spec.dropout}
    if model_type == "llama":
        config.update(attention_bias=spec.has_qkv_bias, mlp_bias=spec.has_mlp_bias, pretraining_tp=1)
    elif model_type == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=spec.n_layers)
    elif model_type == "mixtral":
        config.update(intermediate_size=spec.moe_ffn, num_local_experts=spec.n_experts,
                      num_experts_per_tok=spec.top_k, router_aux_loss_coef=spec.aux_loss_coef,
                      router_jitter_noise=0.0, sliding_window=None, output_router_logits=False)
    else:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=spec.n_layers,
                      qkv_bias=spec.has_qkv_bias, num_experts=spec.n_experts, num_experts_per_tok=spec.top_k,
                      norm_topk_prob=spec.renormalizes_topk, moe_intermediate_size=spec.moe_ffn,
                      shared_expert_intermediate_size=spec.shared_expert_ffn, decoder_sparse_step=spec.moe_every,
                      mlp_only_layers=list(range(spec.first_dense_layers)),
                      router_aux_loss_coef=spec.aux_loss_coef, output_router_logits=False)
    return config, notes


# ---------------------------------------------------------------------------------------------------------------------
# tensor names and transforms

@dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor and the native tensor(s) it holds, with the exact transform between them."""

    hf: str
    native: tuple[str, ...]
    to_native: Callable[[torch.Tensor], list[torch.Tensor]]
    to_hf: Callable[[list[torch.Tensor]], torch.Tensor]


def _same(hf: str, native: str) -> Entry:
    return Entry(hf, (native,), lambda t: [t], lambda ts: ts[0])


def _transposed(hf: str, native: str) -> Entry:
    return Entry(hf, (native,), lambda t: [t.t().contiguous()], lambda ts: ts[0].t().contiguous())


def _split(hf: str, natives: tuple[str, ...], transpose: bool) -> Entry:
    """GPT-2's c_attn: [C, 3C] (Conv1D) or [3C] holding q, k, v in its output columns, in that order."""
    if transpose:
        return Entry(hf, natives, lambda t: [p.contiguous() for p in t.t().chunk(len(natives), 0)],
                     lambda ts: torch.cat(ts, 0).t().contiguous())
    return Entry(hf, natives, lambda t: [p.clone() for p in t.chunk(len(natives), 0)], lambda ts: torch.cat(ts, 0))


def interleave_order(head_dim: int) -> torch.Tensor:
    """Rows of one head in interleaved order, by their half-split index: row 2i is row i, row 2i+1 is row i + D/2
    (the pair Hugging Face rotates together by angle t·θ_i)."""
    half = torch.arange(head_dim // 2)
    return torch.stack((half, half + head_dim // 2), dim=1).flatten()


def _rotary(hf: str, native: str, head_dim: int) -> Entry:
    """q or k (weight [heads·D, C] or bias [heads·D]): rows permuted per head between the two rotary orders."""
    order = interleave_order(head_dim)
    back = torch.argsort(order)

    def permute(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        heads = t.size(0) // head_dim
        return t.reshape(heads, head_dim, *t.shape[1:]).index_select(1, rows.to(t.device)).reshape(t.shape)

    return Entry(hf, (native,), lambda t: [permute(t, order)], lambda ts: permute(ts[0], back))


def tensor_layout(spec: ModelSpec, model_type: str) -> list[Entry]:
    """Every tensor of a ``model_type`` model of ``spec`` in the Hugging Face files (their names as
    save_pretrained writes them), in the order of the model, with the native tensors each holds. A tied head is
    not listed: it is the token embedding."""
    if model_type == "gpt2":
        return _gpt2_layout(spec)
    return _llama_layout(spec, model_type)


def _gpt2_layout(spec: ModelSpec) -> list[Entry]:
    t = "transformer."
    entries = [_same(t + "wte.weight", "embed.tokens.weight"), _same(t + "wpe.weight", "embed.positions.weight")]
    for i in range(spec.n_layers):
        h, n = f"{t}h.{i}.", f"layers.{i}."
        entries += [_same(h + "ln_1.weight", n + "ln1.weight"), _same(h + "ln_1.bias", n + "ln1.bias"),
                    _split(h + "attn.c_attn.weight", tuple(f"{n}attn.{p}.weight" for p in "qkv"), transpose=True),
                    _split(h + "attn.c_attn.bias", tuple(f"{n}attn.{p}.bias" for p in "qkv"), transpose=False),
                    _transposed(h + "attn.c_proj.weight", n + "attn.out.weight"),
                    _same(h + "attn.c_proj.bias", n + "attn.out.bias"),
                    _same(h + "ln_2.weight", n + "ln2.weight"), _same(h + "ln_2.bias", n + "ln2.bias"),
                    _transposed(h + "mlp.c_fc.weight", n + "mlp.up.weight"),
                    _same(h + "mlp.c_fc.bias", n + "mlp.up.bias"),
                    _transposed(h + "mlp.c_proj.weight", n + "mlp.down.weight"),
                    _same(h + "mlp.c_proj.bias", n + "mlp.down.bias")]
    entries += [_same(t + "ln_f.weight", "norm.weight"), _same(t + "ln_f.bias", "norm.bias")]
    if not spec.tied_embeddings:
        entries.append(_same("lm_head.weight", "head.weight"))
    return entries


# The SwiGLU matrices by native name → their Hugging Face names in a dense MLP or Qwen2's experts, and in Mixtral's.
_SWIGLU = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
_MIXTRAL_EXPERT = {"gate": "w1", "down": "w2", "up": "w3"}


def _mlp(hf: str, native: str, bias: bool, names: dict[str, str] = _SWIGLU) -> list[Entry]:
    entries = []
    for ours, theirs in names.items():
        entries.append(_same(f"{hf}{theirs}.weight", f"{native}{ours}.weight"))
        if bias:
            entries.append(_same(f"{hf}{theirs}.bias", f"{native}{ours}.bias"))
    return entries


def _llama_layout(spec: ModelSpec, model_type: str) -> list[Entry]:
    D = spec.head_dim
    entries = [_same("model.embed_tokens.weight", "embed.tokens.weight")]
    for i in range(spec.n_layers):
        h, n = f"model.layers.{i}.", f"layers.{i}."
        a = h + "self_attn."
        entries += [_same(h + "input_layernorm.weight", n + "ln1.weight"),
                    _rotary(a + "q_proj.weight", n + "attn.q.weight", D),
                    _rotary(a + "k_proj.weight", n + "attn.k.weight", D),
                    _same(a + "v_proj.weight", n + "attn.v.weight")]
        if spec.has_qkv_bias:
            entries += [_rotary(a + "q_proj.bias", n + "attn.q.bias", D),
                        _rotary(a + "k_proj.bias", n + "attn.k.bias", D), _same(a + "v_proj.bias", n + "attn.v.bias")]
        entries.append(_same(a + "o_proj.weight", n + "attn.out.weight"))
        if spec.has_attention_out_bias:
            entries.append(_same(a + "o_proj.bias", n + "attn.out.bias"))
        entries.append(_same(h + "post_attention_layernorm.weight", n + "ln2.weight"))
        bias = spec.has_mlp_bias
        if not spec.is_moe_layer(i):
            entries += _mlp(h + "mlp.", n + "mlp.", bias)
        elif model_type == "mixtral":
            moe = h + "block_sparse_moe."
            entries.append(_same(moe + "gate.weight", n + "mlp.router.weight"))
            for e in range(spec.n_experts):
                entries += _mlp(f"{moe}experts.{e}.", f"{n}mlp.experts.{e}.", bias, _MIXTRAL_EXPERT)
        else:
            entries.append(_same(h + "mlp.gate.weight", n + "mlp.router.weight"))
            for e in range(spec.n_experts):
                entries += _mlp(f"{h}mlp.experts.{e}.", f"{n}mlp.experts.{e}.", bias)
            entries += _mlp(h + "mlp.shared_expert.", n + "mlp.shared.", bias)
            entries.append(_same(h + "mlp.shared_expert_gate.weight", n + "mlp.shared_gate.weight"))
    entries.append(_same("model.norm.weight", "norm.weight"))
    if not spec.tied_embeddings:
        entries.append(_same("lm_head.weight", "head.weight"))
    return entries


def hf_shapes(layout: list[Entry], native_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shape of every Hugging Face tensor of ``layout``, from the native model's (on the meta device: the
    transforms run on shapes alone)."""
    shapes = {}
    for entry in layout:
        parts = [torch.empty(native_shapes[n], device="meta") for n in entry.native]
        shapes[entry.hf] = tuple(entry.to_hf(parts).shape)
    return shapes


def parameter_count(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(s) for s in shapes.values())
