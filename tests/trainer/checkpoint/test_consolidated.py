"""One consolidated format for both engines: whole fp32 tensors under the native names in one safetensors file."""
import shutil

import pytest
import torch

from trainer.checkpoint.consolidated import consolidate, load_consolidated, write_consolidated
from trainer.contract.manifest import CONSOLIDATED
from trainer.model import GPT, build_model
from trainer.contract.presets import MODELS


def test_it_writes_a_tied_head_once_and_gives_it_back(tmp_path):
    model = build_model(MODELS["tiny"], 0)
    path = write_consolidated(model.state_dict(), tmp_path / CONSOLIDATED)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert "head.weight" not in f.keys() and "embed.tokens.weight" in f.keys()
    state = load_consolidated(path)
    fresh = GPT(MODELS["tiny"])
    fresh.load_state_dict(state)  # strict
    assert torch.equal(fresh.head.weight, model.embed.tokens.weight)


@pytest.mark.slow
def test_it_consolidates_a_native_expert_parallel_checkpoint_like_the_deepspeed_ones(engine_runs, tmp_path):
    from trainer.generate import load_model_from_checkpoint

    folder = tmp_path / "step-5"
    shutil.copytree(engine_runs / "moe-resume-ep2-to-ep1" / "checkpoints" / "step-5", folder)
    sharded, _ = load_model_from_checkpoint(folder)  # DCP shards of two ranks, each with its own experts
    state = load_consolidated(consolidate(folder))
    assert set(state) == set(sharded.state_dict())
    assert all(torch.equal(v, state[k]) for k, v in sharded.state_dict().items())
