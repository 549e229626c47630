"""One step, the same for every engine: ``train_step`` does forward, backward and the update and answers what it did;
no engine offers half a step. The native engine is run here as a world of one, in this process."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.trainer.launch import records, tiny_spec
from trainer.contract.manifest import complete_checkpoints
from trainer.contract.records import is_step_row
from trainer.data import BatchSampler, load_tokens, prepare_dataset
from trainer.engine.base import Engine, StepResult
from trainer.model import build_model, loss_fn
from trainer.optim import lr_at


def _public(cls) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}


def test_it_gives_both_engines_the_same_steps_and_no_half_step():
    from trainer.engine.deepspeed.engine import DeepSpeedEngine
    from trainer.engine.native import NativeEngine

    protocol = _public(Engine)
    assert "train_step" in protocol
    for engine in (NativeEngine, DeepSpeedEngine):
        assert _public(engine) == protocol, engine.__name__
        assert inspect.signature(engine.train_step) == inspect.signature(Engine.train_step), engine.__name__


@pytest.fixture
def world_of_one():
    """The engine joins a process group of one in this process; none is left behind."""
    joined_here = not dist.is_initialized()
    yield
    if joined_here and dist.is_initialized():
        dist.destroy_process_group()


def _plain_losses(spec, sampler: BatchSampler, steps: int) -> list[float]:
    """The same steps written as directly as PyTorch allows."""
    model = build_model(spec.model, spec.seed)
    opt_spec = spec.optimizer
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opt_spec.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=opt_spec.lr, betas=(opt_spec.beta1, opt_spec.beta2), eps=opt_spec.eps)
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, opt_spec, spec.steps)
        micro = sampler.micro_batches(step)
        total = 0.0
        for x, y in micro:
            loss = loss_fn(model(torch.from_numpy(x)), torch.from_numpy(y))
            (loss / len(micro)).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt_spec.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / len(micro))
    return losses


def test_it_steps_the_native_engine_as_a_plain_pytorch_loop_does(world_of_one, dataset, tmp_path):
    from trainer.engine.native import NativeEngine

    spec = tiny_spec(tmp_path, dataset, steps=4, layers=2)
    engine = NativeEngine(spec)
    engine.build()
    engine.seed(0)
    data = prepare_dataset(spec.dataset, spec.model.vocab_size)
    sampler = BatchSampler(load_tokens(data.train_path), spec.model.seq_len, spec.plan.micro_batch,
                           spec.plan.grad_accum, seed=spec.seed)
    results = [engine.train_step(sampler.micro_batches(step), lr_at(step, spec.optimizer, spec.steps),
                                 measure=step == 0) for step in range(spec.steps)]

    assert all(isinstance(r, StepResult) for r in results)
    assert [r.loss for r in results] == pytest.approx(_plain_losses(spec, sampler, spec.steps), rel=1e-5)
    assert all(r.applied and r.loss_scale == 1.0 and r.routing == {} and r.grad_norm > 0 for r in results)
    measured = results[0].state_bytes
    assert measured["params_bytes"] == measured["grads_bytes"] > 0 and measured["activations_bytes"] > 0
    assert measured["optimizer_bytes"] == 2 * measured["params_bytes"]  # AdamW's two moments after one update
    assert all(r.state_bytes is None for r in results[1:])


def test_it_checkpoints_at_the_cadence_at_a_stop_and_once_at_the_end(world_of_one, dataset, tmp_path):
    from trainer.engine.loop import run

    def saved(folder: Path) -> list[int]:
        return [e["step"] for e in records(folder, "events.jsonl") if e["event"] == "checkpoint_saved"]

    spec = tiny_spec(tmp_path / "run", dataset, steps=6, layers=2, checkpoint_every=4, keep_checkpoints=5)
    assert run(spec, tmp_path / "run", resume=False, stop_at=3) == "stopped"
    assert saved(tmp_path / "run") == [3]
    assert run(spec, tmp_path / "run", resume=True) == "finished"
    assert saved(tmp_path / "run") == [3, 4, 6]
    assert run(spec, tmp_path / "run", resume=True) == "finished"  # resumed at its last step: nothing new to save
    assert saved(tmp_path / "run") == [3, 4, 6]
    assert [step for step, _ in complete_checkpoints(tmp_path / "run")] == [3, 4, 6]
    assert [r["step"] for r in records(tmp_path / "run") if is_step_row(r)] == [1, 2, 3, 4, 5, 6]
