"""Session fixture: a real checkpoint of a small GPT trained on the repository's Shakespeare text.

The real training loop (``trainer.engine.loop.run``) runs in the test process as a world of one, so the result is
a checkpoint folder like any run's (DCP shards, manifest naming the dataset's tokenizer.json), and the reduction,
quality and export tests read it the way deployment will.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec
from trainer.contract.manifest import step_dir
from trainer.contract.presets import demo_text, local_cpu_cluster

TEXT_BYTES = 300_000  # ~145k training and ~7.6k validation tokens of a 512-token BPE
SHAKESPEARE_MODEL = ModelSpec(name="shakespeare-small", n_layers=2, d_model=128, n_heads=4, seq_len=64,
                              vocab_size=512)
TRAIN_STEPS = 400  # 16 sequences of 64 tokens a step, ~30 ms a step on two CPU cores


@pytest.fixture(scope="session")
def shakespeare_checkpoint(tmp_path_factory) -> Path:
    """The final checkpoint folder of TRAIN_STEPS steps of SHAKESPEARE_MODEL on the first TEXT_BYTES of
    tinyshakespeare. Seen: validation perplexity ≈ 25 against the unigram level ≈ 163 (entropy 5.09 nats)."""
    from trainer.engine.loop import run

    root = tmp_path_factory.mktemp("shakespeare")
    (root / "shakespeare.txt").write_bytes(demo_text(TEXT_BYTES))
    dataset = DatasetSpec(path=str(root / "shakespeare.txt"), prepared_dir=str(root / "prepared"))
    spec = RunSpec(model=SHAKESPEARE_MODEL, plan=ParallelPlan(micro_batch=16, global_batch=16),
                   cluster=local_cpu_cluster(1), dataset=dataset, output_dir=str(root / "run"), steps=TRAIN_STEPS,
                   checkpoint_every=TRAIN_STEPS, log_every=100,
                   optimizer=OptimizerSpec(lr=3e-3, min_lr=3e-4, warmup_steps=20)).validate()
    joined_here = not dist.is_initialized()
    try:
        assert run(spec, root / "run", resume=False) == "finished"
    finally:
        if joined_here and dist.is_initialized():  # the loop joined a world of one: leave none behind
            dist.destroy_process_group()
    return step_dir(root / "run", TRAIN_STEPS)
