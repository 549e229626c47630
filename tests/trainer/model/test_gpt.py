"""The GPT itself: parameter counts from docs/formulas.md, seeded initialisation, shapes, refusals."""
import pytest
import torch
import torch.nn.functional as F

from trainer.planner.estimate.flops import matmul_params, model_flops_per_token
from trainer.profiling.memory import SavedActivations
from trainer.model import GPT, build_model, count_parameters, loss_fn
from trainer.model.gpt import MLP
from trainer.parallel.ac import apply_ac
from trainer.contract.presets import MODELS
from trainer.contract import ModelSpec, SpecError

TINY = MODELS["tiny"]


def test_it_counts_12h2_plus_13h_per_block():
    h = TINY.d_model
    model = build_model(TINY, seed=0)
    assert count_parameters(model.layers["0"]) == 12 * h * h + 13 * h
    # L(12h² + 13h) + Vh + s·h + 2h, the head tied to the token embedding
    assert count_parameters(model) == TINY.n_layers * (12 * h * h + 13 * h) + TINY.vocab_size * h + TINY.seq_len * h + 2 * h


def test_it_counts_gpt2_small_like_the_paper():
    with torch.device("meta"):
        model = GPT(MODELS["gpt2-small"])
    assert count_parameters(model) == 124_439_808


def test_it_unties_the_head_when_asked():
    tied = count_parameters(build_model(TINY, 0))
    untied = count_parameters(build_model(TINY.replace(tied_embeddings=False), 0))
    assert untied - tied == TINY.vocab_size * TINY.d_model


def test_it_initialises_from_the_seed_only():
    a, b, c = build_model(TINY, 7), build_model(TINY, 7), build_model(TINY, 8)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.layers["0"].attn.q.weight, c.layers["0"].attn.q.weight)


@pytest.mark.parametrize("kw", [dict(), dict(positions="rope"), dict(n_kv_heads=2), dict(bias=False),
                                dict(positions="rope", n_kv_heads=1, tied_embeddings=False)])
def test_it_predicts_every_position(kw):
    spec = TINY.replace(**kw)
    model = build_model(spec, 0)
    x = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    y = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    logits = model(x)
    assert logits.shape == (2, spec.seq_len, spec.vocab_size)
    loss = loss_fn(logits, y)
    loss.backward()
    # a fresh model predicts about uniformly: loss ≈ ln V
    assert abs(loss.item() - torch.log(torch.tensor(float(spec.vocab_size))).item()) < 0.2


def test_it_is_causal():
    model = build_model(TINY.replace(positions="rope"), 0)
    x = torch.randint(0, TINY.vocab_size, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % TINY.vocab_size
    assert torch.allclose(model(x)[0, :10], model(y)[0, :10], atol=1e-6)


def test_it_counts_model_flops_like_palm():
    spec = MODELS["gpt2-small"]
    h, L = spec.d_model, spec.n_layers
    assert matmul_params(spec) == L * 12 * h * h + spec.vocab_size * h
    assert model_flops_per_token(spec) == 6 * matmul_params(spec) + 12 * L * h * spec.seq_len


def _saved_bytes(mode: str, spec: ModelSpec = TINY) -> tuple[int, float]:
    model = build_model(spec, 0)
    apply_ac(model, mode)
    x = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len), generator=torch.Generator().manual_seed(0))
    with SavedActivations(model.parameters()) as probe:
        loss = loss_fn(model(x), x)
    loss.backward()
    return probe.bytes, loss.item()


def test_it_measures_what_autograd_keeps():
    none, loss = _saved_bytes("none")
    full, loss_full = _saved_bytes("full")
    B, T, C, V, L = 2, TINY.seq_len, TINY.d_model, TINY.vocab_size, TINY.n_layers
    # full recompute keeps each block's input (B·T·C fp32) plus what the head and loss keep (≥ the logits)
    assert full >= L * B * T * C * 4 + B * T * V * 4
    assert none > 3 * full and loss == loss_full


def test_it_recomputes_rotary_and_shared_heads_selectively():
    spec = TINY.replace(positions="rope", n_kv_heads=1)
    none, loss = _saved_bytes("none", spec)
    selective, loss_selective = _saved_bytes("selective", spec)
    assert selective < 0.9 * none and loss == loss_selective


def test_it_uses_the_tanh_approximation_of_gelu_when_asked():
    torch.manual_seed(0)
    exact, tanh = MLP(TINY), MLP(TINY.replace(activation="gelu_tanh"))
    tanh.load_state_dict(exact.state_dict())
    x = torch.randn(2, 8, TINY.d_model) * 3  # wide enough for the two GELUs to differ
    with torch.no_grad():
        expected = tanh.down(F.gelu(tanh.up(x), approximate="tanh"))
        assert torch.equal(tanh(x), expected)
        assert torch.equal(exact(x), exact.down(F.gelu(exact.up(x))))
        assert not torch.allclose(tanh(x), exact(x), atol=1e-7, rtol=0)


def test_it_refuses_an_unknown_activation_naming_the_choices():
    with pytest.raises(SpecError, match="activation: must be one of 'gelu' \\| 'gelu_tanh' \\| 'swiglu', got 'relu'"):
        ModelSpec.from_dict({**TINY.to_dict(), "activation": "relu"})
    assert ModelSpec.from_dict(TINY.replace(activation="gelu_tanh").to_dict()).activation == "gelu_tanh"
