"""bf16 and fp16 (with dynamic loss scaling) follow the fp32 curve under every kind of plan."""
import pytest
import torch

from tests.trainer.conftest import PRECISION_RUNS, PRECISION_STEPS
from tests.trainer.launch import losses, max_rel_error, records
from trainer.optim import LossScaler, lr_at
from trainer.contract import OptimizerSpec


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in (*PRECISION_RUNS[1], *PRECISION_RUNS[2]) if n != "fp32"])
def test_it_follows_fp32_in_16_bits(two_rank_runs, single_rank_runs, name):
    fp32 = losses(single_rank_runs / "precision-fp32")
    got = losses(single_rank_runs / f"precision-{name}")
    assert len(got) == PRECISION_STEPS
    assert max_rel_error(fp32, got) < 1e-3
    if name.startswith("fp16"):
        assert records(single_rank_runs / f"precision-{name}")[-1]["loss_scale"] == 2.0 ** 16


def test_it_skips_a_step_that_overflowed_and_halves_the_scale():
    scaler = LossScaler(True, init_scale=1024.0, growth_interval=2)
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([1024.0, float("inf"), 0.0])
    assert not scaler.unscale_and_check([p], torch.device("cpu"))
    scaler.update(False)
    assert scaler.scale == 512.0
    p.grad = torch.tensor([512.0, 1024.0, 0.0])
    assert scaler.unscale_and_check([p], torch.device("cpu"))
    assert torch.equal(p.grad, torch.tensor([1.0, 2.0, 0.0]))
    scaler.update(True)
    scaler.update(True)
    assert scaler.scale == 1024.0  # two clean steps in a row double it


def test_it_warms_up_then_decays_to_min_lr():
    spec = OptimizerSpec(lr=1e-3, min_lr=1e-4, warmup_steps=4, schedule="cosine")
    assert lr_at(0, spec, 100) == pytest.approx(2.5e-4)
    assert lr_at(3, spec, 100) == pytest.approx(1e-3)
    assert lr_at(4, spec, 100) == pytest.approx(1e-3)
    assert lr_at(99, spec, 100) == pytest.approx(1e-4)
    assert lr_at(52, spec, 100) == pytest.approx(5.5e-4, rel=3e-2)  # about half way down the cosine
    linear = spec.replace(schedule="linear")
    assert lr_at(99, linear, 100) == pytest.approx(1e-4) and lr_at(50, linear, 100) == pytest.approx(5.6e-4, rel=2e-2)
    assert lr_at(70, spec.replace(schedule="constant"), 100) == 1e-3
