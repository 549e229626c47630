"""The host cost of a mixture-of-experts layer's experts: ``expert_overhead_s`` a held expert, an MoE layer and a
micro-batch. Zero by default, linear in the experts a rank runs, explained by a formula that gives its value, and
fitted by ``calibrate`` from records with experts (generated here by the planner under known options)."""
import pytest

from tests.trainer.planner.test_figure_formulas import estimate_figures, evaluate
from trainer.contract import ModelSpec, ParallelPlan
from trainer.contract.presets import local_cpu_cluster
from trainer.planner.estimate import MeasuredRun, calibrate, estimate
from trainer.planner.estimate.calibrate import TERMS
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.options import EstimateOptions

DENSE = ModelSpec(name="dense", n_layers=4, d_model=64, n_heads=4, seq_len=64, vocab_size=512)
PLAN = ParallelPlan(micro_batch=2, global_batch=8)  # 4 micro-batches


def moe(experts: int, layers: int = 4, moe_every: int = 1) -> ModelSpec:
    return DENSE.replace(name=f"moe{experts}", n_layers=layers, n_experts=experts, top_k=1, moe_every=moe_every,
                         ffn_hidden=128)


def expert_term(model: ModelSpec, plan: ParallelPlan, options: EstimateOptions, gpus: int = 1) -> float:
    return Planner(model, local_cpu_cluster(gpus), options).evaluate(plan).time.get("expert_overhead", 0.0)


def test_it_costs_nothing_by_default_and_nothing_in_a_dense_model():
    cpu = local_cpu_cluster(1)
    assert EstimateOptions().expert_overhead_s == 0
    assert "expert_overhead" not in Planner(moe(8), cpu).evaluate(PLAN).time
    assert expert_term(DENSE, PLAN, EstimateOptions(expert_overhead_s=1e-3)) == 0
    with_term = Planner(moe(8), cpu, EstimateOptions(expert_overhead_s=1e-3)).evaluate(PLAN)
    assert with_term.step_s > Planner(moe(8), cpu).evaluate(PLAN).step_s


def test_it_is_linear_in_the_experts_a_rank_holds_the_moe_layers_and_the_micro_batches():
    o = EstimateOptions(expert_overhead_s=1e-3)
    # 4 micro-batches × 4 MoE layers × E experts × 1 ms
    for experts in (2, 4, 8, 16):
        assert expert_term(moe(experts), PLAN, o) == pytest.approx(4 * 4 * experts * 1e-3, rel=1e-12)
    assert expert_term(moe(8, moe_every=2), PLAN, o) == pytest.approx(4 * 2 * 8 * 1e-3, rel=1e-12)
    assert expert_term(moe(8), PLAN.replace(micro_batch=8), o) == pytest.approx(1 * 4 * 8 * 1e-3, rel=1e-12)
    # expert parallel: each rank runs E/ep of them on the tokens sent to it
    ep2 = ParallelPlan(dp=2, ep=2, micro_batch=2, global_batch=8)
    assert expert_term(moe(8), ep2, o, gpus=2) == pytest.approx(2 * 4 * 4 * 1e-3, rel=1e-12)
    # a full recompute runs each expert's forward again
    full = PLAN.replace(activation_checkpointing="full")
    assert expert_term(moe(8), full, o) == pytest.approx(1.5 * expert_term(moe(8), PLAN, o), rel=1e-12)


def test_its_formula_gives_its_value_in_every_figure_of_the_estimate():
    o = EstimateOptions(expert_overhead_s=7e-4, layer_overhead_s=1e-3, microbatch_overhead_s=2e-3)
    plans = [(PLAN, 1), (PLAN.replace(activation_checkpointing="full"), 1),
             (ParallelPlan(dp=2, ep=2, micro_batch=2, global_batch=8), 2)]
    for plan, gpus in plans:
        est = estimate(moe(8), plan, local_cpu_cluster(gpus), o)
        term = est.time["step"].terms["expert_overhead"]
        assert term.value > 0 and "expert_overhead_s" in term.formula
        for path, f in estimate_figures(est):
            if f.formula and f.terms:
                assert evaluate(f.formula, f.terms) == pytest.approx(f.value, rel=1e-9, abs=1e-15), path


TRUTH = EstimateOptions(compute_efficiency=0.3, efficiency_half_work=4096, layer_overhead_s=1.2e-3,
                        microbatch_overhead_s=3e-3, expert_overhead_s=4e-4, step_overhead_s=0.01)


def _records(truth: EstimateOptions) -> list[MeasuredRun]:
    """Dense and MoE runs of one family on one CPU process, as a calibration would measure them: depths, widths,
    micro-batches and expert counts."""
    cpu = local_cpu_cluster(1)
    shapes = [(DENSE, 8), (DENSE, 2), (DENSE.replace(n_layers=2), 4), (DENSE.replace(d_model=128), 4),
              (moe(4), 4), (moe(16), 4), (moe(8, layers=2), 8), (moe(16, layers=2), 2)]
    runs = []
    for model, b in shapes:
        plan = ParallelPlan(micro_batch=b, global_batch=8)
        runs.append(MeasuredRun(model, plan, cpu, Planner(model, cpu, truth).evaluate(plan).step_s))
    return runs


@pytest.mark.parametrize("terms", [TERMS, None], ids=["every term", "terms chosen by leave-one-out"])
def test_calibrate_recovers_a_known_expert_overhead_from_dense_and_moe_records(terms):
    fit = calibrate(_records(TRUTH), terms=terms).clusters["local cpu x1"]
    for name in ("expert_overhead_s", "layer_overhead_s", "microbatch_overhead_s", "compute_efficiency",
                 "efficiency_half_work", "step_overhead_s"):
        assert getattr(fit.options, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6), name
    assert "expert" in fit.time_terms and fit.time_error["max"] < 1e-6


def test_without_moe_records_the_expert_term_keeps_the_base_value():
    dense_only = [r for r in _records(TRUTH) if not r.model.is_moe]
    assert calibrate(dense_only, terms=TERMS).clusters["local cpu x1"].options.expert_overhead_s == 0
    # and a fit that leaves the experts out cannot explain MoE records
    without = [t for t in TERMS if t != "expert"]
    assert calibrate(_records(TRUTH), terms=without).clusters["local cpu x1"].time_error["max"] > 1e-3
