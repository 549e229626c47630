"""Model FLOPs: PaLM's count, Narayanan's cross-check, and the one formula every preset is counted by."""
import pytest

from trainer.planner.estimate import flops as F
from trainer.planner.estimate.params import count
from trainer.contract.presets import MODELS
from trainer.contract import ModelSpec

GPT3 = MODELS["gpt3-175b"]


def test_it_counts_model_flops_as_palm_and_narayanan_do():
    m = GPT3
    assert F.model_flops_per_token(m) == 6 * count(m).matmul_per_token + 12 * m.n_layers * m.d_model * m.seq_len
    B = 1536
    assert F.model_flops_per_token(m) * B * m.seq_len == pytest.approx(F.narayanan_flops_per_step(m, B, False),
                                                                       rel=1e-12)
    full = (F.model_flops_per_token(m) + F.recompute_flops_per_token(m, "full")) * B * m.seq_len
    assert full == pytest.approx(F.narayanan_flops_per_step(m, B, True), rel=1e-12)


def _palm_flops_per_token(m: ModelSpec) -> int:
    """6·N + 12·L·h·s with N summed weight matrix by weight matrix: attention q, k, v and out; the MLP (two
    matrices, three for SwiGLU), or in a mixture-of-experts layer the router, k routed experts of width moe_ffn and
    the shared expert with its 1×h gate; the V·h head, tied or not."""
    h, L, kv = m.d_model, m.n_layers, m.kv_heads * m.head_dim
    attention = h * h + 2 * h * kv + h * h
    matrices = 3 if m.activation == "swiglu" else 2
    shared = matrices * h * m.shared_expert_ffn + (h if m.shared_expert_gate else 0)
    n_moe = len(m.moe_layers)
    n = L * attention + (L - n_moe) * matrices * h * m.ffn \
        + n_moe * (m.top_k * matrices * h * m.moe_ffn + h * m.n_experts + shared) + m.vocab_size * h
    return 6 * n + 12 * L * h * m.seq_len


# every preset, and each with its head tied the other way
SHAPES = {**MODELS, **{f"{name}-{'untied' if m.tied_embeddings else 'tied'}": m.replace(
    tied_embeddings=not m.tied_embeddings) for name, m in MODELS.items()}}


@pytest.mark.parametrize("name", list(SHAPES))
def test_it_counts_every_preset_as_6_n_plus_12_l_h_s(name):
    m = SHAPES[name]
    assert F.model_flops_per_token(m) == _palm_flops_per_token(m)
    assert F.model_flops_per_step(m, 32) == _palm_flops_per_token(m) * 32 * m.seq_len


def test_it_covers_dense_and_moe_tied_and_untied_shapes():
    kinds = {(m.is_moe, m.tied_embeddings) for m in SHAPES.values()}
    assert kinds == {(False, True), (False, False), (True, True), (True, False)}


def test_it_divides_achieved_flops_by_the_peak_of_all_devices():
    # 8 devices of 312 TFLOP/s running at half their peak for 2 s
    assert F.mfu(0.5 * 312e12 * 8 * 2.0, 2.0, 312, 8) == pytest.approx(0.5)
    assert F.mfu(1e15, 0.0, 312, 8) == 0.0 and F.mfu(1e15, -1.0, 312, 8) == 0.0
