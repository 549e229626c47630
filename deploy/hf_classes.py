"""Which Hugging Face class computes a ModelSpec exactly, decided from the spec alone (standard library only).

``deploy.hf_layout`` builds on it (config.json and the tensors both ways); ``deploy.vllm.rules`` reads it to say,
without torch, whether vLLM can load a model's Hugging Face layout.
"""
from __future__ import annotations

from trainer.contract import ModelSpec

# ModelSpec.family → Hugging Face's model_type, and model_type → the class from_pretrained builds.
MODEL_TYPES = {"gpt": "gpt2", "llama": "llama", "qwen2": "qwen2", "mixtral": "mixtral", "qwen2-moe": "qwen2_moe"}
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


class LayoutError(ValueError):
    """A config or a spec the other side cannot express; the message names the field and what to change."""


def model_type_of(spec: ModelSpec) -> str:
    """The model_type whose Hugging Face class computes exactly what ``spec`` does; refused otherwise, naming the
    field to change."""
    model_type = MODEL_TYPES[spec.family]

    def refuse(field: str, why: str) -> LayoutError:
        return LayoutError(f"{field} cannot be exported as a {ARCHITECTURES[model_type]} ({spec.family} family): "
                           f"{why}")

    if model_type == "gpt2":
        if spec.positions != "learned":
            raise refuse("positions='rope'", "GPT-2 has learned positions")
        if spec.is_moe:
            raise refuse(f"n_experts={spec.n_experts}", "GPT-2 has no experts; Mixtral and Qwen2-MoE are Llama-style "
                                                        "(rmsnorm, swiglu, rope)")
        if not (spec.has_qkv_bias and spec.has_attention_out_bias and spec.has_mlp_bias and spec.has_norm_bias):
            raise refuse("bias=false", "GPT-2 has a bias on every projection and LayerNorm")
        if spec.kv_heads != spec.n_heads:
            raise refuse(f"n_kv_heads={spec.n_kv_heads}", "GPT-2 has no grouped-query attention")
        return model_type
    for field, value, wanted in (("norm", spec.norm, "rmsnorm"), ("activation", spec.activation, "swiglu"),
                                 ("positions", spec.positions, "rope")):
        if value != wanted:
            raise refuse(f"{field}={value!r}", f"the {spec.family} family has {field}={wanted!r}")
    if model_type == "llama" and spec.has_qkv_bias != spec.has_attention_out_bias:
        raise refuse("attention_bias", "Llama's attention_bias puts a bias on q, k, v and the output together")
    if model_type != "llama" and (spec.has_attention_out_bias or spec.has_mlp_bias):
        raise refuse("attention_bias / mlp_bias", "this family has biases on q, k and v only")
    if model_type == "mixtral":
        if spec.moe_every != 1 or spec.first_dense_layers:
            raise refuse(f"moe_every={spec.moe_every}, first_dense_layers={spec.first_dense_layers}",
                         "Mixtral has experts on every layer (1, 0)")
        if not spec.renormalizes_topk:
            raise refuse(f"topk_norm={spec.topk_norm!r}", "Mixtral renormalises the chosen experts' weights")
        if spec.has_qkv_bias:
            raise refuse("qkv_bias", "Mixtral has no biases")
    if model_type == "qwen2_moe" and not spec.shared_expert_gate:
        raise refuse("shared_expert_gate=false", "Qwen2-MoE's shared expert is always behind a sigmoid gate")
    return model_type
