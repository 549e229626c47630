"""Weight reductions: int8 per-row quantization within half a scale, the bytes each reduction saves, and what
stays as it was (1-D tensors, a tied head's single matrix)."""
import pytest
import torch

from deploy.reduce import REDUCTIONS, SCALE_SUFFIX, dequantize_state, quantize_rows, reduce_state, state_bytes
from trainer.checkpoint.consolidated import empty_model, load_consolidated, write_consolidated
from trainer.contract.presets import MODELS
from trainer.model import build_model


def tiny_state(**kw) -> dict[str, torch.Tensor]:
    return build_model(MODELS["tiny"].replace(**kw), seed=7).state_dict()


def test_it_keeps_the_int8_round_trip_error_within_half_a_scale():
    gen = torch.Generator().manual_seed(0)
    # rows of very different ranges, and a row of zeros
    weight = torch.randn(6, 300, generator=gen) * torch.tensor([1e-4, 0.02, 1.0, 30.0, 0.5, 0.0])[:, None]
    reduced = reduce_state({"layer.weight": weight}, "int8")
    q, scale = reduced["layer.weight"], reduced["layer.weight" + SCALE_SUFFIX]
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (6,)
    assert int(q.abs().max()) == 127  # each non-zero row's largest weight uses the whole range
    error = (dequantize_state(reduced)["layer.weight"] - weight).abs()
    assert torch.all(error <= scale[:, None] / 2 * (1 + 1e-6)), (error / scale[:, None]).max()
    assert torch.all(error[5] == 0)


def test_it_makes_the_tiny_model_at_least_3_5_times_smaller_in_int8():
    state = tiny_state()
    ratio = state_bytes(state) / state_bytes(reduce_state(state, "int8"))
    assert ratio >= 3.5, ratio


@pytest.mark.parametrize("reduction, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_it_halves_the_bytes_in_bf16_and_fp16(reduction, dtype):
    state = tiny_state()
    reduced = reduce_state(state, reduction)
    assert {t.dtype for t in reduced.values()} == {dtype}
    assert state_bytes(reduced) * 2 == state_bytes(state)


def test_it_leaves_one_dimensional_tensors_untouched_in_int8():
    state = tiny_state()
    reduced = reduce_state(state, "int8")
    one_dimensional = [name for name, t in state.items() if t.dim() == 1]
    assert any(".ln1." in n for n in one_dimensional) and any(n.endswith(".bias") for n in one_dimensional)
    for name in one_dimensional:
        assert reduced[name].dtype == torch.float32 and torch.equal(reduced[name], state[name]), name
        assert name + SCALE_SUFFIX not in reduced


def test_it_keeps_none_as_the_fp32_state():
    state = tiny_state()
    assert all(torch.equal(t, state[n]) for n, t in reduce_state(state, "none").items())


def test_it_names_the_choices_for_an_unknown_reduction():
    with pytest.raises(ValueError, match=r"'int4'.*none, bf16, fp16, int8"):
        reduce_state(tiny_state(), "int4")
    assert REDUCTIONS == ("none", "bf16", "fp16", "int8")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_it_keeps_a_tied_head_one_matrix(reduction, tmp_path):
    state = tiny_state()  # head.weight and embed.tokens.weight: two names of one matrix
    reduced = reduce_state(state, reduction)
    assert reduced["head.weight"] is reduced["embed.tokens.weight"]
    without_head = {n: t for n, t in reduced.items() if not n.startswith("head.")}  # the weight and its scale
    assert state_bytes(reduced) == state_bytes(without_head) < state_bytes({n: t.clone() for n, t in reduced.items()})
    restored = dequantize_state(reduced)
    assert restored["head.weight"] is restored["embed.tokens.weight"]
    # the consolidated format stores it once and gives both names back
    stored = load_consolidated(write_consolidated(reduced, tmp_path / "reduced.safetensors"))
    assert set(stored) == set(reduced) and torch.equal(stored["head.weight"], reduced["embed.tokens.weight"])


@pytest.mark.parametrize("kw", [dict(), dict(positions="rope", tied_embeddings=False)])
def test_it_gives_back_fp32_weights_the_model_loads(kw):
    spec = MODELS["tiny"].replace(**kw)
    model = build_model(spec, seed=7).eval()
    ids = torch.randint(0, spec.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
        for reduction in ("bf16", "int8"):
            restored = dequantize_state(reduce_state(model.state_dict(), reduction))
            assert set(restored) == set(model.state_dict())
            assert {t.dtype for t in restored.values()} == {torch.float32}
            other = empty_model(spec).eval()
            other.load_state_dict(restored)
            assert (other(ids) - expected).abs().max() < 0.02, reduction


def test_it_quantizes_rows_symmetrically():
    q, scale = quantize_rows(torch.tensor([[-2.0, 1.0, 0.0], [0.5, -0.25, 0.0]]))
    assert q.tolist() == [[-127, 64, 0], [127, -64, 0]]
    assert torch.allclose(scale, torch.tensor([2 / 127, 0.5 / 127]))


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-mixtral", "tiny-qwen-moe"])
def test_it_quantizes_every_familys_matrices_and_keeps_its_norms_and_biases(family):
    state = build_model(MODELS[family], seed=7).state_dict()
    reduced = reduce_state(state, "int8")
    matrices = [n for n, t in state.items() if t.dim() == 2]
    assert any(n.endswith(".gate.weight") for n in matrices)  # SwiGLU's, dense or in the experts
    assert all(reduced[n].dtype == torch.int8 and n + SCALE_SUFFIX in reduced for n in matrices)
    assert all(torch.equal(reduced[n], t) for n, t in state.items() if t.dim() == 1)  # RMSNorm gains, q/k/v biases
    assert state_bytes(state) / state_bytes(reduced) >= 3.5
