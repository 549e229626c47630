"""The Llama, Mixtral and Qwen2-MoE blocks against Hugging Face's own: the same weights give the same logits.

Each test builds a tiny model of the family with transformers (configuration in code, random weights), copies its
weights into our GPT built from the matching preset, and compares fp32 logits. Hugging Face rotates the halves of
each head (x[i], x[i+D/2]) where the trainer rotates adjacent pairs (x[2i], x[2i+1]); the copy permutes the rows of
q and k (and Qwen2's q/k biases) per head, which leaves every q·k unchanged.
"""
import pytest
import torch
import torch.nn.functional as F
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from trainer.contract import ModelSpec
from trainer.contract.presets import MODELS
from trainer.model import GPT, KVCache, build_model, initial_value, rotary_frequencies
from trainer.model.gpt import MLP, Embedding, Rotary, make_norm
from trainer.model.moe import MoE, capacity

LAYERS = 2
TOLERANCE = 1e-4


def _interleave_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q or k projection (weight or bias) from half-split to interleaved order within each head."""
    D = w.shape[0] // heads
    order = torch.stack((torch.arange(D // 2), torch.arange(D // 2) + D // 2), dim=-1).flatten()
    return w.reshape(heads, D, *w.shape[1:])[:, order].reshape(w.shape)


def _hf_config_kw(spec: ModelSpec) -> dict:
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_hidden_layers=spec.n_layers,
                num_attention_heads=spec.n_heads, num_key_value_heads=spec.kv_heads,
                max_position_embeddings=spec.seq_len, rms_norm_eps=spec.norm_eps,
                tie_word_embeddings=spec.tied_embeddings)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights far from any initialisation's symmetries: gains around 1, every other tensor N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.1 * noise)


def _copy_from_hf(hf: torch.nn.Module, spec: ModelSpec) -> GPT:
    sd = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    H, K = spec.n_heads, spec.kv_heads
    ours = {"embed.tokens.weight": sd["embed_tokens.weight"], "norm.weight": sd["norm.weight"],
            "head.weight": sd["lm_head.weight"]}
    for i in range(spec.n_layers):
        a, b = f"layers.{i}.", f"layers.{i}."
        ours[a + "ln1.weight"] = sd[b + "input_layernorm.weight"]
        ours[a + "ln2.weight"] = sd[b + "post_attention_layernorm.weight"]
        for mine, theirs, heads in (("q", "q_proj", H), ("k", "k_proj", K), ("v", "v_proj", None),
                                    ("o", "o_proj", None)):
            mine = "out" if mine == "o" else mine
            for kind in ("weight", "bias"):
                t = sd.get(f"{b}self_attn.{theirs}.{kind}")
                if t is not None:
                    ours[f"{a}attn.{mine}.{kind}"] = _interleave_rows(t, heads) if heads else t
        if spec.is_moe_layer(i):
            F_ = spec.moe_ffn
            ours[a + "mlp.router.weight"] = sd[b + "mlp.gate.weight"]
            for e in range(spec.n_experts):
                gate_up = sd[b + "mlp.experts.gate_up_proj"][e]
                ours[f"{a}mlp.experts.{e}.gate.weight"] = gate_up[:F_]
                ours[f"{a}mlp.experts.{e}.up.weight"] = gate_up[F_:]
                ours[f"{a}mlp.experts.{e}.down.weight"] = sd[b + "mlp.experts.down_proj"][e]
            if spec.shared_expert_ffn:
                for mine in ("gate", "up", "down"):
                    ours[f"{a}mlp.shared.{mine}.weight"] = sd[f"{b}mlp.shared_expert.{mine}_proj.weight"]
                ours[a + "mlp.shared_gate.weight"] = sd[b + "mlp.shared_expert_gate.weight"]
        else:
            for mine in ("gate", "up", "down"):
                for kind in ("weight", "bias"):
                    if f"{b}mlp.{mine}_proj.{kind}" in sd:
                        ours[f"{a}mlp.{mine}.{kind}"] = sd[f"{b}mlp.{mine}_proj.{kind}"]
    model = GPT(spec)
    model.load_state_dict(ours, strict=True)  # every parameter of ours given, none of theirs left over
    model.reset_buffers()
    assert set(ours) == set(model.state_dict())
    return model.eval()


def _compare(hf: torch.nn.Module, spec: ModelSpec) -> GPT:
    _randomise(hf, seed=1)
    hf.eval()
    ours = _copy_from_hf(hf, spec)
    x = torch.randint(0, spec.vocab_size, (2, spec.seq_len), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(input_ids=x).logits
        got = ours(x)
    assert expected.abs().max() > 0.5  # logits of a size where a wrong block would show
    assert (got - expected).abs().max().item() < TOLERANCE
    return ours


def _llama_spec() -> ModelSpec:
    return MODELS["tiny-llama"].replace(n_layers=LAYERS)


def _hf_rope(spec: ModelSpec) -> dict:
    rope = {"rope_type": "default", "rope_theta": spec.rope_base}
    if spec.rope_scaling is not None:
        s = spec.rope_scaling
        rope.update(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                    high_freq_factor=s.high_freq_factor, original_max_position_embeddings=s.original_max_positions)
    return rope


def _llama_config(spec: ModelSpec) -> LlamaConfig:
    return LlamaConfig(**_hf_config_kw(spec), intermediate_size=spec.ffn, rope_parameters=_hf_rope(spec),
                       attention_bias=spec.has_qkv_bias, mlp_bias=spec.has_mlp_bias)


def test_it_scales_rotary_frequencies_like_llama_3_1():
    spec = _llama_spec()
    assert spec.rope_scaling is not None
    config = _llama_config(spec.replace(d_model=512, n_heads=4))  # head_dim 128: every band of the rule is hit
    expected, factor = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    got = rotary_frequencies(128, spec.rope_base, spec.rope_scaling)
    assert factor == 1.0 and torch.allclose(got, expected.float(), rtol=1e-6, atol=0)
    plain = rotary_frequencies(128, spec.rope_base)
    assert (got < plain).any() and (got == plain).any()  # some stretched, some kept


def test_it_computes_llama_logits_like_transformers():
    spec = _llama_spec()
    _compare(LlamaForCausalLM(_llama_config(spec)), spec)


def test_it_computes_llama_logits_with_biases_like_transformers():
    spec = _llama_spec().replace(bias=True, rope_scaling=None)  # q, k, v, out and MLP biases; RMSNorm has none
    _compare(LlamaForCausalLM(_llama_config(spec)), spec)


def test_it_computes_mixtral_logits_like_transformers():
    spec = MODELS["tiny-mixtral"].replace(n_layers=LAYERS)
    config = MixtralConfig(**_hf_config_kw(spec), intermediate_size=spec.moe_ffn, rope_parameters=_hf_rope(spec),
                           num_local_experts=spec.n_experts, num_experts_per_tok=spec.top_k)
    ours = _compare(MixtralForCausalLM(config), spec)
    assert all(int(m.stats.dropped) == 0 for m in ours.modules() if isinstance(m, MoE))


@pytest.mark.parametrize("first_dense", [0, 1])
def test_it_computes_qwen2_moe_logits_like_transformers(first_dense):
    spec = MODELS["tiny-qwen-moe"].replace(n_layers=LAYERS, first_dense_layers=first_dense)
    config = Qwen2MoeConfig(**_hf_config_kw(spec), intermediate_size=spec.ffn, moe_intermediate_size=spec.moe_ffn,
                            shared_expert_intermediate_size=spec.shared_expert_ffn, rope_parameters=_hf_rope(spec),
                            num_experts=spec.n_experts, num_experts_per_tok=spec.top_k,
                            norm_topk_prob=spec.renormalizes_topk, qkv_bias=spec.has_qkv_bias,
                            mlp_only_layers=list(range(first_dense)), decoder_sparse_step=spec.moe_every)
    ours = _compare(Qwen2MoeForCausalLM(config), spec)
    assert isinstance(ours.layers["0"].mlp, MLP) == bool(first_dense)
    assert ours.layers["1"].attn.q.bias is not None and ours.layers["1"].attn.out.bias is None


def test_it_normalises_with_rmsnorm_or_layernorm_as_the_spec_says():
    rms, layer = make_norm(MODELS["tiny-qwen-moe"]), make_norm(MODELS["tiny"])
    assert isinstance(rms, torch.nn.RMSNorm) and rms.eps == 1e-6
    assert [n for n, _ in rms.named_parameters()] == ["weight"]
    assert isinstance(layer, torch.nn.LayerNorm) and layer.bias is not None
    x = torch.randn(3, 64) * 5 + 2
    with torch.no_grad():
        assert torch.allclose(rms(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), atol=1e-5)
        assert not torch.allclose(rms(x), layer(x), atol=1e-2)  # RMSNorm does not subtract the mean


def test_it_gates_the_swiglu_mlp():
    spec = MODELS["tiny-llama"]
    torch.manual_seed(0)
    mlp = MLP(spec, 96)
    assert (mlp.gate.weight.shape, mlp.up.weight.shape, mlp.down.weight.shape) == ((96, 64), (96, 64), (64, 96))
    assert mlp.gate.bias is None
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        assert torch.allclose(mlp(x), (F.silu(x @ mlp.gate.weight.T) * (x @ mlp.up.weight.T)) @ mlp.down.weight.T,
                              atol=1e-6)


def test_it_weights_experts_by_raw_or_renormalised_probabilities():
    torch.manual_seed(0)
    raw_spec = MODELS["tiny-qwen-moe"].replace(shared_expert_ffn=0, shared_expert_gate=False)
    raw = MoE(raw_spec, lambda: torch.nn.Linear(64, 64, bias=False))
    renormalised = MoE(raw_spec.replace(topk_norm="renormalize"), lambda: torch.nn.Linear(64, 64, bias=False))
    renormalised.load_state_dict(raw.state_dict())
    with torch.no_grad():
        for e in raw.experts.values():
            e.weight.copy_(torch.eye(64))  # every expert the identity: the output is x · Σ of the weights
        renormalised.load_state_dict(raw.state_dict())
        x = torch.randn(1, 8, 64)
        probs = F.softmax(raw.router(x.reshape(-1, 64)), -1)
        top = probs.topk(2, -1).values.sum(-1)
        assert torch.allclose(raw(x).reshape(-1, 64), x.reshape(-1, 64) * top[:, None], atol=1e-6)
        assert torch.allclose(renormalised(x), x, atol=1e-6)


def test_it_drops_no_token_when_capacity_factor_is_zero():
    assert capacity(100, 4, 2, 0.0) == 100
    torch.manual_seed(0)
    layer = MoE(MODELS["tiny-mixtral"], lambda: torch.nn.Linear(64, 64))
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 10.0  # route (nearly) every token to expert 0 first
    layer(torch.rand(2, 32, 64))
    assert int(layer.stats.load[0]) == 64 and int(layer.stats.dropped) == 0


def test_it_initialises_every_new_parameter_by_its_kind():
    spec = MODELS["tiny-qwen-moe"].replace(first_dense_layers=1)
    model = build_model(spec, 0)
    names = dict(model.named_parameters())
    small = 0.02 / (2 * spec.n_layers) ** 0.5
    for name, p in names.items():
        if name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "norm.weight":
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            std = small if name.endswith(("down.weight", "attn.out.weight")) else 0.02
            assert p.std().item() == pytest.approx(std, rel=0.5 if p.numel() < 1000 else 0.1), name
    for name in ("layers.0.mlp.gate.weight", "layers.1.mlp.shared.gate.weight", "layers.1.mlp.shared_gate.weight",
                 "layers.1.mlp.experts.3.down.weight", "layers.1.attn.q.bias"):
        assert name in names
        assert torch.equal(names[name], initial_value(spec, name, tuple(names[name].shape), 0))


def test_it_rotates_and_embeds_rows_at_the_positions_given():
    spec = MODELS["tiny-llama"]
    rotary = Rotary(16, 64, spec.rope_base, spec.rope_scaling)
    x = torch.randn(2, 4, 64, 16)
    order = torch.cat((torch.arange(0, 8), torch.arange(56, 64)))  # a context-parallel rank's two chunks
    assert torch.equal(rotary(x[:, :, order], positions=order), rotary(x)[:, :, order])
    assert torch.equal(rotary(x[:, :, order], positions=order.expand(2, -1)), rotary(x)[:, :, order])
    assert torch.equal(rotary(x[:, :, 10:20], start=10), rotary(x)[:, :, 10:20])
    embed = Embedding(MODELS["tiny"])
    idx = torch.randint(0, 512, (2, 64))
    assert torch.equal(embed(idx[:, order], positions=order), embed(idx)[:, order])


def test_it_takes_default_positions_when_given_them_explicitly():
    spec = MODELS["tiny-qwen-moe"]
    model = build_model(spec, 0)
    x = torch.randint(0, spec.vocab_size, (2, 32))
    with torch.no_grad():
        assert torch.equal(model(x, positions=torch.arange(32)), model(x))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen-moe"])
def test_it_generates_with_a_cache_as_it_scores_the_whole_sequence(name):
    spec = MODELS[name]
    model = build_model(spec, 0).eval()
    x = torch.randint(0, spec.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = model(x)
        cache = KVCache()
        steps = [model(x[:, :5], cache)] + [model(x[:, t:t + 1], cache) for t in range(5, 12)]
    assert torch.allclose(torch.cat(steps, dim=1), whole, atol=1e-5)
