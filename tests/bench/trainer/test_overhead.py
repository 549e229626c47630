"""Section 1 of the benchmark runs (its ratio is printed by python -m bench.trainer, not asserted: the machine that
runs the tests is shared), and its reference is the lean loop it claims to be."""
import ast
import inspect

import pytest
import torch
import torch.distributed as dist

from bench.trainer import overhead
from bench.trainer.overhead import LeanGPT, engine_vs_plain, overhead_model, overhead_spec, plain_loop_step_times
from trainer.model import build_model, count_parameters


def test_it_times_the_engine_and_its_loop_against_a_plain_loop_in_alternating_pairs(dataset, tmp_path):
    joined_here = not dist.is_initialized()
    try:
        o = engine_vs_plain(tmp_path, dataset, steps=3, pairs=2, skip=1)
    finally:
        if joined_here and dist.is_initialized():
            dist.destroy_process_group()
    assert o["pairs"] == 2 and o["model"] == overhead_model()
    assert min(o["plain_ms"], o["engine_ms"], o["loop_ms"]) > 0
    for ratio, (low, high) in ((o["ratio"], o["ratio_range"]), (o["loop_ratio"], o["loop_ratio_range"])):
        assert 0 < low <= ratio <= high


def test_a_run_too_short_to_leave_a_step_after_the_skipped_ones_is_refused(dataset, tmp_path):
    with pytest.raises(ValueError, match="no step after"):
        engine_vs_plain(tmp_path, dataset, steps=5, pairs=1, skip=5)


def test_the_reference_is_written_outside_the_project_model():
    imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(overhead)))
                if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("trainer.model") for name in imported)


def test_the_reference_fuses_qkv_uses_an_untied_head_and_the_engine_does_not_clip(dataset, tmp_path):
    spec = overhead_spec(tmp_path, dataset, steps=2)
    model = LeanGPT(spec.model)
    m = spec.model
    assert (m.n_layers, m.d_model, m.n_heads, m.seq_len, m.vocab_size) == (4, 128, 4, 128, 2048)
    assert (spec.plan.micro_batch, spec.plan.global_batch, spec.plan.precision) == (8, 8, "fp32")
    assert spec.optimizer.grad_clip == 0
    assert all(block.qkv.weight.shape == (3 * m.d_model, m.d_model) for block in model.blocks)
    assert model.head.weight.data_ptr() != model.tokens.weight.data_ptr()
    # the same parameter count as the engine's model: the two train the same shape
    assert sum(p.numel() for p in model.parameters()) == count_parameters(build_model(spec.model, 0))


def test_the_reference_trains(dataset, tmp_path):
    spec = overhead_spec(tmp_path, dataset, steps=2)
    torch.manual_seed(0)
    times = plain_loop_step_times(spec, steps=2)
    assert len(times) == 2 and min(times) > 0
