"""Llama-, Qwen2- and Qwen2-MoE-style models train under parallel plans and recomputation as one process does: per-step
losses equal within 1e-5 relative (fp32, 20 steps).

The blocks (RMSNorm, SwiGLU's gate beside up, q/k/v biases, rotary scaling, routed and shared experts) must be cut,
sharded and wrapped like GPT-2's: tensor and sequence parallel, FSDP2, DeepSpeed's ZeRO-2 and ZeRO-3 (its engine
wraps the native model), full and selective recompute (expert parallel with the shared expert, and the other MoE
plans: test_moe_plans.py). One 2-rank launch runs every parallel job, one single-process launch the references and the
recomputing runs.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.conftest import PARITY_STEPS
from tests.trainer.launch import launch, losses, max_rel_error, model_jobs, records
from trainer.contract.presets import MODELS

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5
LLAMA, QWEN = MODELS["tiny-llama"], MODELS["tiny-qwen-moe"]
QWEN2 = LLAMA.replace(name="", qkv_bias=True)  # dense Qwen2: Llama's blocks with q/k/v biases, split with their rows
DS = dict(engine="deepspeed", dp=2)
# name → (model, plan fields); each is compared with "<family>-none", the same model on one process
TWO_RANK = {
    "llama-fsdp2": (LLAMA, dict(dp=2, zero_stage=3)),
    "llama-ds-zero2": (LLAMA, dict(zero_stage=2, **DS)),
    "llama-ds-zero3": (LLAMA, dict(zero_stage=3, **DS)),
    # tensor parallel is the slowest plan on gloo (DTensor): one run covers RMSNorm under sequence parallel, SwiGLU's
    # gate and up split alike, and q/k/v biases split with their rows
    "qwen2-tp2-sp": (QWEN2, dict(tp=2, sequence_parallel=True)),
}
ONE_RANK = {f"{family}-{mode}": (model, dict(activation_checkpointing=mode))
            for family, model in (("llama", LLAMA), ("qwen-moe", QWEN)) for mode in ("none", "selective", "full")}
ONE_RANK["qwen2-none"] = (QWEN2, {})


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory, dataset) -> Path:
    runs = tmp_path_factory.mktemp("family-runs")
    launch(2, model_jobs(runs, dataset, TWO_RANK, PARITY_STEPS), runs / "jobs")
    launch(1, model_jobs(runs, dataset, ONE_RANK, PARITY_STEPS), runs / "jobs")
    return runs


def _reference(runs: Path, name: str) -> list[float]:
    return losses(runs / f"{name.split('-')[0] if name.startswith(('llama', 'qwen2')) else 'qwen-moe'}-none")


@pytest.mark.parametrize("name", list(TWO_RANK))
def test_it_trains_the_family_like_one_process_on_two_ranks(family_runs, name):
    got = losses(family_runs / name)
    assert len(got) == PARITY_STEPS
    assert max_rel_error(_reference(family_runs, name), got) < TOLERANCE


@pytest.mark.parametrize("family", ["llama", "qwen-moe"])
def test_it_recomputes_the_family_without_changing_the_losses(family_runs, family):
    ref = losses(family_runs / f"{family}-none")
    assert ref[-1] < ref[0] - 0.5  # it learns
    for mode in ("selective", "full"):
        assert max_rel_error(ref, losses(family_runs / f"{family}-{mode}")) < TOLERANCE, mode


@pytest.mark.parametrize("family", ["llama", "qwen-moe"])
def test_it_keeps_fewer_activations_when_recomputing_the_family(family_runs, family):
    saved = {mode: records(family_runs / f"{family}-{mode}")[0]["memory"]["activations_bytes"]
             for mode in ("none", "selective", "full")}
    # selective finds attention's core (rotary, the shared key/value heads); full keeps only each block's input
    assert saved["full"] * 2 <= saved["selective"] < saved["none"]
