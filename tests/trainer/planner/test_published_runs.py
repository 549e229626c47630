"""The planner against what was measured on GPUs: published training runs end to end
(``bench.trainer.planner.published``) and one published layer, kernel by kernel. One of these numbers sets a
constant, the A100's layer fraction (the 22B layer's forward); the rest are predictions (docs/formulas.md, Kernel
rates and Against published runs)."""
from __future__ import annotations

import json
import statistics

import pytest

from bench.trainer.planner import published as bench_published
from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.presets import MODELS, cluster
from trainer.planner.estimate.comm import ring_all_reduce_s, tp_all_reduces_per_layer
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.published import MEGATRON_2021, published_runs

# Korthikanti et al. 2022, Table 4: one layer of the 22B model (h 6144, 64 heads, s 2048, micro-batch 4, t = 8)
LAYER_22B = ModelSpec(name="22B", n_layers=48, d_model=6144, n_heads=64, seq_len=2048, vocab_size=51200, dropout=0.1)
SELENE_NODE = cluster("A100-SXM-80GB", 1, inter_node_bandwidth_gbs=25.0)


def test_the_benchmark_compares_every_run_of_both_papers_with_its_error(capsys):
    assert bench_published.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["runs"]
    assert [r["source"] for r in rows].count("Narayanan et al. 2021, Table 1") == 10
    assert sum(r["source"].startswith("Korthikanti") for r in rows) == 13
    assert [r["run"] for r in rows if not r["published_fit"]] == [f"{n}, no recompute" for n in
                                                                  ("22B", "175B", "530B", "1T")]
    for row, run in zip(rows, published_runs()):
        numbers = Planner(run.model, run.cluster, run.options).evaluate(run.plan)
        assert row["predicted_step_s"] == pytest.approx(numbers.step_s)
        if run.step_s is None:
            assert row["throughput_error"] is None
        else:
            assert row["throughput_error"] == pytest.approx(run.step_s / numbers.step_s - 1)
        assert row["peak_high_gb"] == pytest.approx(numbers.peak_band.high / 1e9)
        assert row["predicted_fit"] == (numbers.peak_band.high <= 85.9e9)
    errors = [abs(r["throughput_error"]) for r in rows if r["throughput_error"] is not None]
    assert out["summary"]["median_abs_error"] == pytest.approx(statistics.median(errors))
    assert out["summary"]["max_abs_error"] == pytest.approx(max(errors))
    assert bench_published.main([]) == 0
    assert "median |error|" in capsys.readouterr().out


def test_the_planner_predicts_published_runs_within_five_percent_at_the_median_and_twelve_at_most():
    """The goal (median 5 %, max 12 %) and a ratchet on today's figures (3.8 %, 6.8 %): a change to the model that
    makes the published runs worse fails here."""
    rows = [bench_published.compare(run) for run in published_runs()]
    summary = bench_published.summary(rows)
    assert summary["median_abs_error"] <= 0.04
    assert summary["max_abs_error"] <= 0.07


def test_every_run_that_ran_fits_at_the_high_end_of_its_band_and_none_that_did_not_is_said_to_fit():
    rows = [bench_published.compare(run) for run in published_runs()]
    summary = bench_published.summary(rows)
    assert summary["fits_missed"] == [] and summary["fits_claimed_wrongly"] == []
    for r in rows:
        # none of the runs that did not fit comes within 10 % of fitting, even as expected
        assert r.run.fit or r.peak_gb > 0.9 * r.capacity_gb


def _layer_ms(sequence_parallel: bool = False, checkpointing: str = "none") -> tuple[float, float]:
    """Forward and backward of one 22B layer on an A100 with its tensor-parallel communication, in ms, as Megatron-LM
    runs them: the backward's all-reduces (or reduce-scatters and re-gathers) behind its weight-gradient GEMMs, but
    under sequence parallel the all-gather in front of the row-parallel layer's backward; a recompute's forward with
    its communication."""
    plan = ParallelPlan(tp=8, micro_batch=4, global_batch=4, precision="bf16", sequence_parallel=sequence_parallel,
                        activation_checkpointing=checkpointing)
    planner = Planner(LAYER_22B, SELENE_NODE, MEGATRON_2021)
    work = planner.layer_work(plan, moe=False)
    all_reduce = ring_all_reduce_s(4 * 2048 * 6144 * 2, 8, planner.bandwidths(plan)["tp"])
    exposed = max(0.0, 2 * all_reduce - work.weight_grad_s) + (all_reduce / 2 if sequence_parallel else 0.0)
    replayed = 2 * all_reduce if checkpointing == "full" else 0.0
    return (1e3 * (work.forward.seconds + 2 * all_reduce),
            1e3 * (work.backward.seconds + exposed + work.recompute.seconds + replayed))


def test_a_layer_of_the_22b_model_takes_its_measured_time_in_every_row_of_korthikantis_table_4():
    """The forward without recompute sets the A100's layer fraction (gpu_kernels); the other rows are predictions."""
    forward, backward = _layer_ms()
    assert forward == pytest.approx(7.7, rel=0.005)
    assert backward == pytest.approx(11.9, rel=0.03)
    assert _layer_ms(checkpointing="full")[1] == pytest.approx(19.5, rel=0.03)
    assert _layer_ms(checkpointing="selective")[1] == pytest.approx(13.2, rel=0.03)
    # sequence parallel runs the norms, dropouts and residual adds on 1/t of the tokens
    sp_forward, sp_backward = _layer_ms(sequence_parallel=True)
    assert (sp_forward, sp_backward) == (pytest.approx(7.2, rel=0.03), pytest.approx(11.8, rel=0.03))
    assert sum(_layer_ms(sequence_parallel=True, checkpointing="selective")) == pytest.approx(20.3, rel=0.03)


def test_the_tensor_parallel_overlap_hides_the_backward_all_reduces_behind_weight_gradients():
    model, plan = MODELS["gpt3-175b"], ParallelPlan(tp=8, micro_batch=1, global_batch=8, precision="bf16")
    bandwidth_only = EstimateOptions(collective_latency_s=0.0)
    plain = Planner(model, cluster("A100-SXM-80GB", 1), bandwidth_only).evaluate(plan).time["tensor_parallel"]
    overlapped = Planner(model, cluster("A100-SXM-80GB", 1), bandwidth_only.replace(tp_overlap=True)).evaluate(plan)
    # four all-reduces a layer; the forward's two stay, the backward's two hide behind larger weight-gradient GEMMs
    assert overlapped.time["tensor_parallel"] == pytest.approx(plain / 2, rel=1e-9)


def test_a_vocabulary_off_the_tensor_core_alignment_costs_time():
    aligned = MODELS["gpt2-medium"].replace(vocab_size=50304)
    plan = ParallelPlan(dp=8, micro_batch=8, global_batch=64, precision="bf16")
    a100 = cluster("A100-SXM-80GB", 1)
    odd = Planner(MODELS["gpt2-medium"], a100).evaluate(plan).time["compute"]
    even = Planner(aligned, a100).evaluate(plan).time["compute"]
    assert odd > even * 1.02   # 50,257 is not a multiple of 8: the head runs off the aligned tensor-core path
    # the FLOPs model sees the same FLOPs either way
    flops_model = EstimateOptions(compute_model="efficiency")
    assert Planner(MODELS["gpt2-medium"], a100, flops_model).evaluate(plan).time["compute"] == pytest.approx(
        Planner(aligned, a100, flops_model).evaluate(plan).time["compute"], rel=2e-3)


@pytest.mark.parametrize("checkpointing, sequence_parallel, engine, all_reduces", [
    ("none", False, "megatron", 4), ("full", False, "megatron", 6), ("selective", False, "native", 4),
    ("none", True, "megatron", 5), ("full", True, "megatron", 7),  # Megatron-LM gathers each input again
    ("none", True, "native", 4),  # torch's sequence parallel keeps the gathered input for the weight gradient
])
def test_a_layer_issues_the_tensor_parallel_collectives_its_engine_does(checkpointing, sequence_parallel, engine,
                                                                        all_reduces):
    plan = ParallelPlan(tp=8, micro_batch=4, global_batch=4, precision="bf16", engine=engine,
                        sequence_parallel=sequence_parallel, activation_checkpointing=checkpointing)
    assert tp_all_reduces_per_layer(plan) == all_reduces
    planner = Planner(LAYER_22B, SELENE_NODE, EstimateOptions(attention="math"))
    exposed = planner.evaluate(plan).step_time.parts["tensor_parallel"]
    one = ring_all_reduce_s(4 * 2048 * 6144 * 2, 8, planner.bandwidths(plan)["tp"])
    # and the embedding's and head's two, and each collective's latency (under a tenth here)
    assert exposed == pytest.approx((48 * all_reduces + 2) * one, rel=0.1)
