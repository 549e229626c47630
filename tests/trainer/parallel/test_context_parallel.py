"""Context parallel: ring attention over a zig-zag split equals attention over the whole sequence, and plans with cp
train as one process does.

Ring attention is checked on two gloo ranks against F.scaled_dot_product_attention on the whole sequence (forward
and the gradients of q, k and v, fp32, 1e-5), with and without grouped-query heads. The trainer is checked on
tiny-llama (rotary positions, key/value heads shared by two query heads, RMSNorm) and on the GPT-2-style 'tiny'
(learned positions, tied head): cp2, cp2 × tp2 with sequence parallel, FSDP2 over dp2 × cp2; 20 fp32 steps (the
four-rank plans stop after 6: four processes on two cores make every collective wait its turn), per-step losses
within 1e-5 relative of one process. One launch per world size.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from tests.trainer.conftest import PARITY_STEPS
from tests.trainer.launch import free_port, launch, losses, max_rel_error, model_jobs, records
from trainer.contract import ParallelPlan
from trainer.contract.presets import MODELS
from trainer.contract.rules import check_plan
from trainer.parallel.context import ring_attention, zigzag_gather, zigzag_positions, zigzag_slice
from trainer.planner.estimate.core import Planner

TOLERANCE = 1e-5
# (batch, query heads, key/value heads, sequence, head size)
SHAPES = {"mha": (2, 4, 4, 24, 8), "gqa": (2, 4, 2, 32, 16)}


def test_the_zigzag_split_gives_each_rank_an_early_and_a_late_chunk():
    t = torch.arange(24).view(1, 24)
    parts = [zigzag_slice(t, 3, r) for r in range(3)]
    assert parts[0].tolist() == [[0, 1, 2, 3, 20, 21, 22, 23]]
    assert parts[2].tolist() == [[8, 9, 10, 11, 12, 13, 14, 15]]
    assert torch.equal(zigzag_gather(parts), t)
    for r in range(3):
        assert torch.equal(zigzag_positions(24, 3, r), parts[r][0])
    with pytest.raises(ValueError, match="into 2·cp=6 equal chunks; 2·cp does not divide 20"):
        zigzag_positions(20, 3, 0)


def _whole(shape, seed: int):
    b, h, k, t, d = shape
    gen = torch.Generator().manual_seed(seed)
    q, key, v, w = (torch.randn(b, n, t, d, generator=gen) for n in (h, k, k, h))
    return q, key, v, w


def _ring_rank(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for name, shape in SHAPES.items():
            q, k, v, w = _whole(shape, seed=len(name))
            mine = [zigzag_slice(x, 2, rank, dim=2).requires_grad_() for x in (q, k, v)]
            out = ring_attention(*mine, dist.group.WORLD)
            (out * zigzag_slice(w, 2, rank, dim=2)).sum().backward()
            # As numpy arrays, pickled by value: a tensor would travel as a handle to this process's shared memory,
            # which the parent could no longer open once this process has exited.
            results.put((name, rank, *(t.detach().numpy() for t in (out, *(x.grad for x in mine)))))
    finally:
        dist.destroy_process_group()


def test_ring_attention_on_two_ranks_equals_attention_over_the_whole_sequence():
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ranks = [context.Process(target=_ring_rank, args=(r, port, results)) for r in range(2)]
    for p in ranks:
        p.start()
    got = {}
    for _ in range(2 * len(SHAPES)):
        name, rank, *arrays = results.get(timeout=120)
        got[(name, rank)] = [torch.from_numpy(a) for a in arrays]
    for p in ranks:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in ranks)
    for name, shape in SHAPES.items():
        q, k, v, w = _whole(shape, seed=len(name))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        group = shape[1] // shape[2]
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                             is_causal=True)
        (out * w).sum().backward()
        for i, (what, ref) in enumerate((("out", out), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))):
            whole = zigzag_gather([got[(name, 0)][i], got[(name, 1)][i]], dim=2)
            assert torch.allclose(whole, ref.detach(), rtol=TOLERANCE, atol=TOLERANCE), (name, what)


def test_the_contract_refuses_what_context_parallel_cannot_run():
    tiny = MODELS["tiny"]
    assert any("dropout" in m for m in check_plan(tiny.replace(dropout=0.1), ParallelPlan(cp=2)).get("cp", []))
    assert any("mixture-of-experts" in m for m in check_plan(MODELS["tiny-mixtral"], ParallelPlan(cp=2))["cp"])
    assert any("2·cp=6" in m for m in check_plan(tiny, ParallelPlan(cp=3))["cp"])  # seq_len 64
    assert not check_plan(MODELS["tiny-llama"], ParallelPlan(cp=2, tp=2, sequence_parallel=True, dp=2))


# name → (model, plan fields), each compared with the same model on one process
LLAMA, TINY = MODELS["tiny-llama"], MODELS["tiny"]
TWO_RANK = {"llama-cp2": (LLAMA, dict(cp=2)), "tiny-cp2": (TINY, dict(cp=2))}
FOUR_RANK = {"llama-cp2-tp2-sp": (LLAMA, dict(cp=2, tp=2, sequence_parallel=True)),
             "llama-fsdp-dp2-cp2": (LLAMA, dict(cp=2, dp=2, zero_stage=3))}
ONE_RANK = {"llama-ref": (LLAMA, {}), "tiny-ref": (TINY, {})}
FOUR_RANK_STEPS = 6


@pytest.fixture(scope="module")
def cp_runs(tmp_path_factory, dataset) -> Path:
    runs = tmp_path_factory.mktemp("cp-runs")
    launch(1, model_jobs(runs, dataset, ONE_RANK, PARITY_STEPS), runs / "jobs")
    launch(2, model_jobs(runs, dataset, TWO_RANK, PARITY_STEPS), runs / "jobs")
    launch(4, model_jobs(runs, dataset, FOUR_RANK, PARITY_STEPS, stop_at=FOUR_RANK_STEPS), runs / "jobs")
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", [*TWO_RANK, *FOUR_RANK])
def test_a_context_parallel_plan_trains_as_one_process(cp_runs, name):
    ref = losses(cp_runs / f"{name.split('-')[0]}-ref")
    got = losses(cp_runs / name)
    assert len(got) == (PARITY_STEPS if name in TWO_RANK else FOUR_RANK_STEPS)
    assert ref[-1] < ref[0] - 0.5  # it learns
    assert max_rel_error(ref[:len(got)], got) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-ref", "llama-cp2"])
def test_the_planner_counts_what_a_context_parallel_rank_saves(cp_runs, dataset, name):
    """The activations a rank saved in its first forward (the trainer's own saved-tensor probe, ring attention's
    blocks and log-sum-exps included) against the planner's per-micro-batch figure (docs/formulas.md), within 1 %:
    one process's, and a cp rank's, whose keys and values are saved before the repeat to the query heads."""
    [job] = model_jobs(cp_runs, dataset, {name: {**ONE_RANK, **TWO_RANK}[name]}, PARITY_STEPS)
    spec = job["spec"]
    measured = next(r["memory"]["activations_bytes"] for r in records(cp_runs / name)
                    if r.get("memory", {}).get("activations_bytes"))
    planned = Planner(spec.model, spec.cluster).stage_memory(spec.plan, 0).activations_per_microbatch
    assert sum(planned.values()) == pytest.approx(measured, rel=0.01)


def test_the_plain_formula_for_other_devices_gives_the_fused_kernels_blocks(monkeypatch):
    from trainer.parallel import context

    q, k, v, w = _whole(SHAPES["gqa"], seed=7)
    half = q.size(2) // 2
    cases = [(q, k, v, True), (q, k[:, :, :half], v[:, :, :half], False), (q[:, :, half:], k, v, False)]
    fused = [(context._block_forward(*case[:3], case[3], 0.125), case) for case in cases]
    monkeypatch.setattr(context, "FUSED_DEVICES", ())
    for (out, lse), (qb, kb, vb, causal) in fused:
        plain_out, plain_lse = context._block_forward(qb, kb, vb, causal, 0.125)
        assert torch.allclose(plain_out, out, atol=TOLERANCE) and torch.allclose(plain_lse, lse, atol=TOLERANCE)
        dout = w[:, :, :qb.size(2)]
        plain = context._block_backward(dout, qb, kb, vb, out, lse, causal, 0.125)
        monkeypatch.setattr(context, "FUSED_DEVICES", ("cpu",))
        expected = context._block_backward(dout, qb, kb, vb, out, lse, causal, 0.125)
        monkeypatch.setattr(context, "FUSED_DEVICES", ())
        for got, want in zip(plain, expected):
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4)
