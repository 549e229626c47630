"""Session fixtures of deployment: real checkpoints to serve, and one real Triton server for the session.

- ``shakespeare_checkpoint``: a small GPT trained on the repository's Shakespeare text by the real training loop,
  run in the test process as a world of one, so the result is a checkpoint folder like any run's (DCP shards, a
  manifest naming the dataset's tokenizer.json), read by the reduction, quality and export tests as deployment does.
- ``parallel_checkpoint``: a tiny GPT trained with tensor parallel 2 × pipeline parallel 2 (four torchrun ranks) on
  the same dataset.
  Both are trained once per test run, whatever the number of xdist workers (``tests.xdist_groups.once_per_run``).
- ``triton``: the real tritonserver 2.51 (``deploy.triton.LocalTriton``) on free ports, started on first use and
  stopped at the end of the session; its model repository is empty at start.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from deploy.triton import LocalTriton
from tests.trainer.launch import launch, tiny_spec
from tests.xdist_groups import once_per_run

from trainer.contract import DatasetSpec, ModelSpec, OptimizerSpec, ParallelPlan, RunSpec
from trainer.contract.manifest import step_dir
from trainer.contract.presets import demo_text, local_cpu_cluster

def greedy_of(checkpoint: Path):
    """The trainer's own greedy continuation of a prompt by ``checkpoint``: what a served model must answer."""
    from trainer.generate import generate, load_model_from_checkpoint

    model, tokenizer = load_model_from_checkpoint(checkpoint)

    def greedy(prompt: str, n: int) -> list[int]:
        ids = tokenizer.encode(prompt)
        return generate(model, ids, n, temperature=0)[len(ids):]
    return greedy


def logprobs_of(checkpoint: Path):
    """The checkpoint's own log-probabilities, as a served model must give them: ids → (len(ids), V), row t the
    distribution of the token after ids[t]; and its tokenizer (``tokenizers``), which names a token as the served
    models do: ``tokenizer.decode([id], skip_special_tokens=False)``."""
    import torch
    from tokenizers import Tokenizer

    from trainer.contract.manifest import read_manifest
    from trainer.generate import load_model_from_checkpoint

    model, _ = load_model_from_checkpoint(checkpoint)
    tokenizer = Tokenizer.from_file(read_manifest(checkpoint).tokenizer)

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)
    return logprobs, tokenizer


TEXT_BYTES = 300_000  # ~145k training and ~7.6k validation tokens of a 512-token BPE
SHAKESPEARE_MODEL = ModelSpec(name="shakespeare-small", n_layers=2, d_model=128, n_heads=4, seq_len=64,
                              vocab_size=512)
TRAIN_STEPS = 400  # 16 sequences of 64 tokens a step, ~30 ms a step on two CPU cores
PARALLEL_STEPS = 30


@pytest.fixture(scope="session")
def shakespeare_checkpoint(tmp_path_factory) -> Path:
    """The final checkpoint folder of TRAIN_STEPS steps of SHAKESPEARE_MODEL on the first TEXT_BYTES of
    tinyshakespeare. Seen: validation perplexity ≈ 25 against the unigram level ≈ 163 (entropy 5.09 nats)."""
    return step_dir(once_per_run(tmp_path_factory, "shakespeare", _train_shakespeare) / "run", TRAIN_STEPS)


def _train_shakespeare(root: Path) -> None:
    import torch.distributed as dist

    from trainer.engine.loop import run

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


@pytest.fixture(scope="session")
def served_checkpoint(shakespeare_checkpoint) -> Path:
    """The checkpoint the web app's deployment tests register and serve."""
    return shakespeare_checkpoint


@pytest.fixture(scope="session")
def parallel_checkpoint(shakespeare_checkpoint, tmp_path_factory) -> Path:
    """The last checkpoint of the ``tiny`` preset trained PARALLEL_STEPS steps with tp=2 × pp=2 on four ranks,
    on the Shakespeare fixture's prepared dataset (so it has the same tokenizer)."""
    dataset = DatasetSpec(path=str(shakespeare_checkpoint.parents[2] / "shakespeare.txt"),
                          prepared_dir=str(shakespeare_checkpoint.parents[2] / "prepared"))

    def train(root: Path) -> None:
        spec = tiny_spec(root / "run", dataset, PARALLEL_STEPS, model=SHAKESPEARE_MODEL.replace(name="tiny-parallel"),
                         tp=2, pp=2, micro_batch=2, global_batch=8, checkpoint_every=PARALLEL_STEPS)
        launch(4, [{"spec": spec, "run_dir": root / "run", "resume": False, "stop_at": 0}], root / "jobs")

    return step_dir(once_per_run(tmp_path_factory, "parallel", train) / "run", PARALLEL_STEPS)


@pytest.fixture(scope="session")
def triton(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    server = LocalTriton.on_free_ports(root / "models", root / "work")
    server.start()
    yield server
    server.stop()
