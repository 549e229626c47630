"""The planner's formulas are written once: each term of a step is one expression in ``step_model``, each term of a
rank's memory one in ``memory_model``, from which both the number and the printed formula come, and no other module
restates one."""
from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

from tests.trainer.planner.test_figure_formulas import evaluate
from trainer.contract import ParallelPlan, SpecError
from trainer.contract.presets import MODELS, cluster, local_cpu_cluster
from trainer.planner.estimate import estimate, memory_model, params_model, step_model
from trainer.planner.estimate import memory as M
from trainer.planner.estimate import params as P
from trainer.planner.estimate.core import Planner
from trainer.planner.estimate.expr import Term, symbols
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.published import published_runs

ROOT = Path(__file__).resolve().parents[3]
TERMS = {f"{module.__name__.rsplit('.', 1)[1]}.{name}": value for module in (step_model, memory_model, params_model)
         for name, value in vars(module).items() if isinstance(value, Term)}
PLANS = [
    (MODELS["gpt3-175b"], cluster("A100-SXM-80GB", 16), ParallelPlan(dp=2, tp=8, pp=8, micro_batch=1, global_batch=64,
                                                                     precision="bf16", sequence_parallel=True),
     EstimateOptions(tp_overlap=True)),
    (MODELS["mixtral-8x7b"], cluster("H100-SXM", 4), ParallelPlan(dp=4, ep=4, tp=2, pp=4, micro_batch=1,
                                                                  global_batch=32, precision="bf16",
                                                                  pipeline_schedule="zbv", virtual_stages=2),
     EstimateOptions()),
    (MODELS["tiny-llama"], local_cpu_cluster(4), ParallelPlan(dp=2, cp=2, micro_batch=2, global_batch=8,
                                                              engine="native", zero_stage=3),
     EstimateOptions(layer_overhead_s=1e-3, step_overhead_s=0.01)),
    (MODELS["gpt2-medium"], cluster("A100-SXM-80GB", 1), ParallelPlan(dp=8, micro_batch=2, global_batch=64,
                                                                      precision="bf16", engine="deepspeed",
                                                                      zero_stage=2, offload_optimizer=True),
     EstimateOptions(compute_model="efficiency")),
]


def test_every_part_of_a_step_prints_the_formula_of_the_term_that_computed_it():
    cases = PLANS + [(r.model, r.cluster, r.plan, r.options) for r in published_runs()]
    seen = set()
    for model, clu, plan, options in cases:
        numbers = Planner(model, clu, options).evaluate(plan)
        step = estimate(model, plan, clu, options).time["step"]
        assert set(step.terms) == set(numbers.time)
        for name, figure in step.terms.items():
            term, args = numbers.step_time.terms[name]
            assert figure.formula == term.formula and figure.value == term.function(*args), name
            seen.add(term)
    # the cases reach most terms; the rest are variants of these (offload with parameters, the other bubble)
    assert len(seen) >= 14


def test_every_part_of_a_ranks_memory_prints_the_formula_of_the_term_that_computed_it():
    cases = PLANS + [(r.model, r.cluster, r.plan, r.options) for r in published_runs()]
    seen = set()
    for model, clu, plan, options in cases:
        numbers = Planner(model, clu, options).evaluate(plan)
        stages = estimate(model, plan, clu, options).memory["stages"]
        for st, figures in zip(numbers.stages, stages):
            for name, held in st.activation_terms.items():
                figure = figures["activations_per_microbatch"].terms[name]
                formula = held.saved.term.formula_times(held.per) if held.per else held.saved.term.formula
                assert figure.formula == formula and figure.value == held.value, name
                seen.add(held.saved.term)
            for name, saved in st.state_terms.items():
                assert figures[name].formula == saved.term.formula and figures[name].value == saved.value, name
                seen.add(saved.term)
            for name, terms in st.buffer_terms.items():
                shown = figures["buffers"].terms[name]
                parts = [shown] if len(terms) == 1 else list(shown.terms.values())
                for saved, figure in zip(terms, parts, strict=True):
                    assert figure.formula == saved.term.formula and figure.value == saved.value, name
                    seen.add(saved.term)
            in_flight = figures["activations"].terms["in_flight"]
            assert in_flight.formula == M.in_flight_saved(plan, st.stage).term.formula
            assert in_flight.value == st.in_flight
    assert len(seen) >= 30


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _strings(path: Path) -> str:
    """The string literals a module's code uses (what it could print as a formula), docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return "\n".join(node.value for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings)


def test_no_module_restates_a_formula(tmp_path):
    """Whitespace aside, the text of no term of step time or memory appears among the strings of the project's code:
    a formula printed anywhere is printed from its term (in ``step_model`` and ``memory_model`` the terms are Python,
    not this text)."""
    texts = {name: _squeeze(term.expr.text()) for name, term in TERMS.items() if len(term.expr.names()) > 1}
    sources = [p for folder in ("trainer", "webapp", "workers", "deploy") for p in (ROOT / folder).rglob("*.py")]
    restated = [(name, str(p.relative_to(ROOT))) for p in sources
                for strings in [_squeeze(_strings(p))] for name, text in texts.items() if text in strings]
    assert not restated
    assert sum(name.startswith("step_model.") for name in texts) >= 20
    assert sum(name.startswith("memory_model.") for name in texts) >= 40
    assert sum(name.startswith("params_model.") for name in texts) >= 8
    # the check finds a restated formula, and leaves a docstring's alone
    planted = tmp_path / "planted.py"
    planted.write_text('"""The bubble is (p − 1)/(v·m)."""\nLABEL = "bubble (p−1) / (v·m) of the step"\n'
                       'NORMS = {"layernorm_inputs": "2·T·h·e_norm / r  (the norms\' inputs)"}\n')
    strings = _squeeze(_strings(planted))
    assert strings.count(texts["step_model.BUBBLE"]) == 1
    assert strings.count(texts["memory_model.LAYERNORM_INPUTS"]) == 1


@pytest.mark.parametrize("name", sorted(TERMS))
def test_a_terms_printed_formula_evaluates_to_its_value(name):
    term = TERMS[name]
    rng = random.Random(name)
    args = [rng.uniform(1.5, 9.0) for _ in term.params.split()]
    printed = term.formula
    assert evaluate(printed, term.values(tuple(args))) == pytest.approx(term.function(*args), rel=1e-12)


def test_a_term_must_name_each_of_its_symbols_once():
    a, b = symbols("a b")
    with pytest.raises(ValueError, match="must name each symbol"):
        Term(a * b, "a")
    with pytest.raises(ValueError, match="must name each symbol"):
        Term(a * b, "a b a")
    assert Term(2 * (a - 1) / a * b, "a b").formula == "2 · (a − 1) / a · b"
    assert Term(a - (b - 1), "a b")(5, 3) == 3 and Term(a - (b - 1), "a b").formula == "a − (b − 1)"


FIGURE_MAKERS = {"fig": 2, "Figure": 2, "symbolic": 2}   # the position of the formula among their arguments


def _formulas_written_as_text(path: Path) -> list[str]:
    """The formulas a module hands to a figure as text of its own (a string, an f-string, strings joined or added),
    not as a term's ``formula``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FIGURE_MAKERS:
            formula = node.args[FIGURE_MAKERS[node.func.id]] if len(node.args) > FIGURE_MAKERS[node.func.id] else \
                next((k.value for k in node.keywords if k.arg == "formula"), None)
            if formula is not None and not _is_a_terms_formula(formula):
                found.append(ast.unparse(formula))
    return found


def _is_a_terms_formula(node: ast.expr) -> bool:
    """``term.formula`` or ``term.formula_times(count)``."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr in ("formula", "formula_times")


def test_the_estimates_figures_print_only_the_formulas_of_terms(tmp_path):
    """``explain`` writes no formula of its own: every figure it makes prints a term's formula (a sum of named
    parts is ``figure.total``'s)."""
    assert _formulas_written_as_text(ROOT / "trainer/planner/estimate/explain.py") == []
    planted = tmp_path / "planted.py"
    planted.write_text('a = fig(1, "s", "gemm + attention")\nb = Figure(1, "s", f"{x} + y")\n'
                       'c = symbolic(1, "s", " + ".join(parts), {})\nd = Figure(1, "s", term.formula)\n')
    assert _formulas_written_as_text(planted) == ['\'gemm + attention\'', "f'{x} + y'", "' + '.join(parts)"]


def test_the_parameter_counts_print_the_formulas_that_computed_them():
    checked = 0
    for model in MODELS.values():
        for plan in (ParallelPlan(), ParallelPlan(tp=2, pp=2, micro_batch=1, global_batch=4)):
            try:
                result = estimate(model, plan, cluster("H100-SXM", 1, gpus_per_node=plan.world_size))
            except SpecError:   # a plan the model cannot take (layers or heads that do not divide)
                continue
            figures = result.parameters
            for name, (term, args) in P.count_terms(model).items():
                if name in figures:
                    assert figures[name].formula == term.formula
                    assert figures[name].value == term.function(*args) == getattr(P.count(model), name)
            ranks = [figures[f"stage_{st}_rank"].value for st in range(plan.pp)]
            assert ranks == [st.params for st in result.numbers.stages]
            checked += 1
    assert checked >= len(MODELS)
