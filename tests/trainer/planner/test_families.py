"""The Llama, Mixtral and Qwen2-MoE presets and the planner's block formulas for them.

Parameters: each published preset agrees with its published config.json (typed in below: Meta's Llama 3 / 3.1 / 3.2,
Mistral AI's Mixtral-8x7B-v0.1, Qwen's Qwen1.5-MoE-A2.7B), and the planner's count equals Hugging Face transformers'
model built from that config on the meta device (no weights) and the published total (docs/formulas.md,
Parameters). FLOPs: 6·N + the attention products, N summed here from the matrix shapes of the block. Activations:
the planner's bytes of one micro-batch against the trainer's own model measured with saved-tensor hooks.
"""
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen2MoeConfig

from bench.trainer.activations import FAMILY_CASES, measure_saved, planned_saved
from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS, cluster
from trainer.planner.estimate import flops
from trainer.planner.estimate import memory as M
from trainer.planner.estimate.core import Planner
from trainer.model import GPT, count_parameters
from trainer.planner.estimate.params import block_matmul_params, block_tensors, count, expert_params

_LLAMA3 = dict(vocab_size=128256, num_key_value_heads=8, rope_theta=500000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu")
_LLAMA31_SCALING = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=8192)
# The values of each model's published config.json that decide its shape.
PUBLISHED = {
    "llama3-8b": (LlamaConfig, dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                    num_attention_heads=32, max_position_embeddings=8192)),
    "llama3-70b": (LlamaConfig, dict(_LLAMA3, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                     num_attention_heads=64, max_position_embeddings=8192)),
    "llama3.1-405b": (LlamaConfig, dict(_LLAMA3, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                                        num_attention_heads=128, max_position_embeddings=131072,
                                        rope_scaling=dict(_LLAMA31_SCALING, factor=8.0))),
    "llama3.2-1b": (LlamaConfig, dict(_LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                      num_attention_heads=32, head_dim=64, max_position_embeddings=131072,
                                      tie_word_embeddings=True, rope_scaling=dict(_LLAMA31_SCALING, factor=32.0))),
    "mixtral-8x7b": (MixtralConfig, dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                         num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6,
                                         rms_norm_eps=1e-5, max_position_embeddings=32768,
                                         tie_word_embeddings=False, hidden_act="silu", router_aux_loss_coef=0.02)),
    "qwen1.5-moe-a2.7b": (Qwen2MoeConfig, dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632,
                                               moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                                               num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                                               num_experts=60, num_experts_per_tok=4, norm_topk_prob=False,
                                               decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1e6,
                                               rms_norm_eps=1e-6, max_position_embeddings=8192,
                                               tie_word_embeddings=False, hidden_act="silu",
                                               router_aux_loss_coef=0.001)),
}
# Total parameters as published: the Hugging Face model pages' safetensors totals (exact), and the rounded figures
# of the model cards and papers (billions): Llama 3 8B / 70B (Meta's model card), 405B and 1B (Llama 3.1 and 3.2
# model cards, "The Llama 3 Herd of Models" Table 3), Mixtral 46.7 B total / 12.9 B active (Mistral AI's release,
# Jiang et al. 2024), Qwen1.5-MoE-A2.7B 14.3 B total / 2.7 B activated (Qwen's model card).
PUBLISHED_TOTALS = {"llama3-8b": (8_030_261_248, 8.0), "llama3-70b": (70_553_706_496, 70.6),
                    "llama3.1-405b": (405_853_388_800, 405.9), "llama3.2-1b": (1_235_814_400, 1.2),
                    "mixtral-8x7b": (46_702_792_704, 46.7), "qwen1.5-moe-a2.7b": (14_315_784_192, 14.3)}
PUBLISHED_ACTIVE = {"mixtral-8x7b": 12.9, "qwen1.5-moe-a2.7b": 2.7}


def hf_config_values(spec) -> dict:
    """What a preset says in the terms of its Hugging Face config."""
    values = dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.n_layers,
                  num_attention_heads=spec.n_heads, num_key_value_heads=spec.kv_heads, rope_theta=spec.rope_base,
                  rms_norm_eps=spec.norm_eps, tie_word_embeddings=spec.tied_embeddings, hidden_act="silu")
    if spec.family == "llama":
        values.update(intermediate_size=spec.ffn, attention_bias=spec.has_qkv_bias, mlp_bias=spec.has_mlp_bias,
                      head_dim=spec.head_dim)
        if spec.rope_scaling:
            r = spec.rope_scaling
            values["rope_scaling"] = dict(rope_type="llama3", factor=r.factor, low_freq_factor=r.low_freq_factor,
                                          high_freq_factor=r.high_freq_factor,
                                          original_max_position_embeddings=r.original_max_positions)
    elif spec.family == "mixtral":
        values.update(intermediate_size=spec.moe_ffn, num_local_experts=spec.n_experts,
                      num_experts_per_tok=spec.top_k, router_aux_loss_coef=spec.aux_loss_coef)
    else:
        values.update(intermediate_size=spec.ffn, moe_intermediate_size=spec.moe_ffn, num_experts=spec.n_experts,
                      shared_expert_intermediate_size=spec.shared_expert_ffn, num_experts_per_tok=spec.top_k,
                      norm_topk_prob=spec.renormalizes_topk, decoder_sparse_step=spec.moe_every,
                      mlp_only_layers=list(range(spec.first_dense_layers)), router_aux_loss_coef=spec.aux_loss_coef)
    return values


def meta_count(config_class, values: dict) -> int:
    """Parameters of transformers' model of this config, built on the meta device (shapes only)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_class(**values))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_each_preset_is_its_published_config(name):
    config_class, published = PUBLISHED[name]
    ours = hf_config_values(MODELS[name])
    assert {k: ours[k] for k in ours if k in published} == {k: published[k] for k in ours if k in published}
    assert not {"rope_scaling"} & (ours.keys() ^ published.keys())  # scaling on both sides or on neither


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_counts_equal_transformers_and_the_published_totals(name):
    config_class, published = PUBLISHED[name]
    exact, billions = PUBLISHED_TOTALS[name]
    counts = count(MODELS[name])
    assert counts.total == meta_count(config_class, published) == exact
    assert round(counts.total / 1e9, 1) == billions
    if name in PUBLISHED_ACTIVE:
        assert round(counts.active / 1e9, 1) == PUBLISHED_ACTIVE[name]


@pytest.mark.parametrize("name, config_class", [("tiny-llama", LlamaConfig), ("tiny-mixtral", MixtralConfig),
                                                ("tiny-qwen-moe", Qwen2MoeConfig)])
def test_tiny_family_counts_equal_transformers(name, config_class):
    spec = MODELS[name]
    values = hf_config_values(spec)
    if config_class is LlamaConfig:
        values["rope_scaling"]["original_max_position_embeddings"] = spec.rope_scaling.original_max_positions
    assert count(spec).total == meta_count(config_class, values)
    # the same with q/k/v biases (Qwen2's dense blocks on Llama's config), and with the first two layers dense
    if config_class is LlamaConfig:
        assert count(spec.replace(attention_bias=True, mlp_bias=True)).total == \
            meta_count(config_class, {**values, "attention_bias": True, "mlp_bias": True})
    if config_class is Qwen2MoeConfig:
        dense_first = spec.replace(first_dense_layers=2)
        assert count(dense_first).total == meta_count(config_class, hf_config_values(dense_first))
        assert len(dense_first.moe_layers) == 2


def _attention_matmul(spec) -> int:
    h, kv = spec.d_model, spec.kv_heads * spec.head_dim
    return h * h + 2 * kv * h + h * h  # q, k, v, out


@pytest.mark.parametrize("name", ["llama3-8b", "llama3.1-405b", "llama3.2-1b", "tiny-llama"])
def test_swiglu_flops_per_token_are_six_times_three_matrices_plus_attention(name):
    spec = MODELS[name]
    L, h, f, s, V = spec.n_layers, spec.d_model, spec.ffn, spec.seq_len, spec.vocab_size
    n_matmul = L * (_attention_matmul(spec) + 3 * h * f) + V * h  # gate, up, down; the head tied or not
    assert flops.matmul_params(spec) == n_matmul
    assert flops.model_flops_per_token(spec) == 6 * n_matmul + 12 * L * h * s
    # full recompute runs every block's forward again: 2 FLOPs per block weight and the attention forward
    assert flops.recompute_flops_per_token(spec, "full") == 2 * (n_matmul - V * h) + 4 * L * h * s


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen1.5-moe-a2.7b", "tiny-mixtral", "tiny-qwen-moe"])
def test_moe_flops_per_token_count_top_k_routed_experts_and_the_shared_one(name):
    spec = MODELS[name]
    L, h, s, V, E, k = spec.n_layers, spec.d_model, spec.seq_len, spec.vocab_size, spec.n_experts, spec.top_k
    routed = k * 3 * h * spec.moe_ffn
    shared = 3 * h * spec.shared_expert_ffn + (h if spec.shared_expert_gate else 0)  # the gate is a 1×h matrix
    per_layer = _attention_matmul(spec) + h * E + routed + shared
    assert block_matmul_params(spec, True) == per_layer
    assert expert_params(spec) == 3 * h * spec.moe_ffn
    assert flops.model_flops_per_token(spec) == 6 * (L * per_layer + V * h) + 12 * L * h * s


def test_dense_first_layers_have_the_dense_mlp():
    spec = MODELS["tiny-qwen-moe"].replace(first_dense_layers=1, ffn_hidden=96)
    h, kv = spec.d_model, spec.kv_heads * spec.head_dim
    dense = count(spec.replace(n_experts=0, shared_expert_ffn=0, shared_expert_gate=False)).per_dense_block
    moe = count(spec).per_moe_block
    assert count(spec).total == count(spec.replace(first_dense_layers=0)).total - moe + dense
    assert dense == 2 * h + (h * h + h) + 2 * (kv * h + kv) + h * h + 3 * h * 96  # norms, q/k/v with biases, out, MLP


# Activations of one micro-batch: the planner against what autograd saves in the trainer's own model
# (bench.trainer.activations, saved-tensor hooks), for each family in fp32, bf16 autocast and the bf16-cast model,
# and each checkpointing mode once. Every case comes out exact; the bar is 1 %.
ACTIVATION_CASES = [c for c in FAMILY_CASES
                    if c[0] == "tiny-llama" or (c[2], c[3]) in (("none", "fp32"), ("none", "bf16"))]


@pytest.mark.parametrize("case", ACTIVATION_CASES, ids=["-".join(map(str, c)) for c in ACTIVATION_CASES])
def test_planned_activations_match_what_the_trainer_saves(case):
    name, b, mode, precision, zero = case
    spec = MODELS[name]
    measured = measure_saved(spec, b, mode, precision, zero)
    assert planned_saved(spec, b, mode, precision, zero) == pytest.approx(measured, rel=0.01)


def test_swiglu_layer_saves_four_ffn_wide_tensors_and_rmsnorm_one_statistic():
    """The per-layer terms as derived in docs/formulas.md (Activation memory, RMSNorm and SwiGLU), on a GPU (the
    fused RMSNorm kernel) in bf16 without autocast: T tokens, e = 2."""
    spec = MODELS["llama3-8b"]
    h, f, kv, s = spec.d_model, spec.ffn, spec.kv_heads * spec.head_dim, spec.seq_len
    settings = M.ActivationSettings(micro_batch=1, tp=1, sequence_parallel=False, checkpointing="none",
                                    bytes_per_element=2, attention="fused", small_terms=True, repeat_kv=True)
    terms = dict(M.layer_activations(M.LayerShape.of(spec), settings))
    T, e = s, 2
    assert terms["swiglu"] == 4 * T * f * e
    assert terms["rmsnorm_stats"] == 2 * T * 4 and "rmsnorm_normalized" not in terms
    assert terms["layernorm_inputs"] == terms["layernorm_outputs"] == 2 * T * h * e
    assert sum(terms.values()) == (2 * 2 * h + 4 * f + (h + 2 * h) + h + h) * T * e + 2 * T * 4 \
        + 2 * s * (spec.head_dim // 2) * e + T * spec.n_heads * 4  # + rotary tables, log-sum-exp
    assert kv < h  # grouped-query keys and values are saved repeated to h before the kernel


def test_dropless_routing_sends_the_whole_dispatch_buffer():
    """Capacity factor 0 drops no token: the trainer gives each of the E experts T slots, and expert parallel's
    all-to-all moves that (E, T, h) buffer, as a capacity factor of E/k would."""
    spec = MODELS["mixtral-8x7b"]
    plan = ParallelPlan(dp=8, ep=2, micro_batch=1, global_batch=8, precision="bf16", zero_stage=0)
    stage = Planner(spec, cluster("H100-SXM", 1)).stage_memory(plan, 0)
    T, E, h = spec.seq_len, spec.n_experts, spec.d_model
    assert M.expert_capacity(T, E, spec.top_k, 0.0) == T
    assert stage.buffers["all_to_all"] == 2 * E * T * h * 2
    assert stage.activations_per_microbatch["moe_expert_inputs"] == spec.n_layers * E * T * h * 2


@pytest.mark.parametrize("name, changes", [("tiny-llama", {}), ("tiny-llama", dict(qkv_bias=True, mlp_bias=True)),
                                           ("tiny-mixtral", {}), ("tiny-qwen-moe", dict(first_dense_layers=1))])
def test_block_tensors_are_the_trainers_parameters(name, changes):
    """Names and shapes, tensor by tensor (FSDP chunks each tensor's rows, so the per-rank figures rest on them)."""
    spec = MODELS[name].replace(**changes)
    with torch.device("meta"):
        model = GPT(spec)
    held = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for i in range(spec.n_layers):
        expected = {}
        for t in block_tensors(spec, spec.is_moe_layer(i)):
            shape = (t.rows,) if t.cols == 1 else (t.rows, t.cols)
            for e in (range(spec.n_experts) if t.expert else [None]):
                expected[f"layers.{i}." + (t.name.replace(".e.", f".{e}.") if t.expert else t.name)] = shape
        assert {n: s for n, s in held.items() if n.startswith(f"layers.{i}.")} == expected
    assert count(spec).total == count_parameters(model)
