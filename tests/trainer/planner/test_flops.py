"""Model FLOPs: PaLM's count and Narayanan's cross-check."""
import pytest

from trainer.planner.estimate import flops as F
from trainer.planner.estimate.params import count
from trainer.contract.presets import MODELS

GPT3 = MODELS["gpt3-175b"]


def test_it_counts_model_flops_as_palm_and_narayanan_do():
    m = GPT3
    assert F.model_flops_per_token(m) == 6 * count(m).matmul_per_token + 12 * m.n_layers * m.d_model * m.seq_len
    B = 1536
    assert F.model_flops_per_token(m) * B * m.seq_len == pytest.approx(F.narayanan_flops_per_step(m, B, False),
                                                                       rel=1e-12)
    full = (F.model_flops_per_token(m) + F.recompute_flops_per_token(m, "full")) * B * m.seq_len
    assert full == pytest.approx(F.narayanan_flops_per_step(m, B, True), rel=1e-12)

