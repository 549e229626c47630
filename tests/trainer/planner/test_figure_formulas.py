"""Every figure of an estimate tells the truth: its formula, evaluated from its own terms, gives its value.

A figure's formula is an expression over the names of its terms (numbers, or sub-figures standing for their values),
written in the notation the estimate prints: · and × multiply, − subtracts, / divides, ² squares, ⌈x⌉ and ceil/floor
round, min/max, ≤ compares (a 0/1 figure). Whatever follows two spaces is a note for the reader and is not
evaluated (e.g. ``4·P_rank  (fp32 gradients)``). A figure built by ``figure.total`` has the names of its parts
joined by + as its formula, so the same check makes its value the sum of its parts.

The check runs over the whole figure tree of a few hundred training estimates — every preset model (dense, MoE,
rotary, with dropout), plans over dp/tp/pp/sp/ep, engine and ZeRO stage, offload, checkpointing, precision,
pipeline schedule and virtual stages, drawn from the tuner's plan space (which yields only plans the contract
accepts) — and of serving estimates. Values are floats: a relative tolerance of 1e-9 absorbs the order of the
operations, nothing else.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import random
import time
from typing import get_args

import pytest

from trainer.contract import ParallelPlan, check_plan
from trainer.contract.presets import MODELS, cluster, local_cpu_cluster
from trainer.contract.schedules import Schedule
from trainer.planner.estimate import estimate, inference_estimate
from trainer.planner.estimate.figure import Figure, fig, total, walk
from trainer.planner.estimate.options import EstimateOptions
from trainer.planner.estimate.published import published_runs
from trainer.planner.estimate.serving import HostCosts, Load, Rates, serving_estimate
from trainer.planner.tune.space import SearchSpace, enumerate_plans

REL_TOL = 1e-9

# ---- a small evaluator: numbers, term names, + − · × / ** ^ ² ( ) ⌈ ⌉, min max ceil floor, comparisons -------
_NOTATION = (("·", "*"), ("×", "*"), ("−", "-"), ("²", "**2"), ("³", "**3"), ("^", "**"), ("⌈", "ceil("),
             ("⌉", ")"), ("⌊", "floor("), ("⌋", ")"), ("≤", "<="), ("≥", ">="))
_FUNCTIONS = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor}
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b}
_COMPARE = {ast.LtE: lambda a, b: a <= b, ast.Lt: lambda a, b: a < b, ast.GtE: lambda a, b: a >= b,
            ast.Gt: lambda a, b: a > b}


class NotEvaluable(ValueError):
    pass


def expression(formula: str) -> str:
    """The evaluable part of a formula (what precedes a two-space note), in Python's notation."""
    expr = formula.split("  ", 1)[0].strip()
    for symbol, python in _NOTATION:
        expr = expr.replace(symbol, python)
    return expr


def evaluate(formula: str, terms: dict) -> float:
    """The formula's value from the figure's terms; raises NotEvaluable for anything but the notation above."""
    try:
        tree = ast.parse(expression(formula), mode="eval")
    except SyntaxError as exc:
        raise NotEvaluable(f"not an expression: {formula!r}") from exc

    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in terms:
                raise NotEvaluable(f"{node.id!r} is not a term of {formula!r}")
            term = terms[node.id]
            term = term.value if isinstance(term, Figure) else term
            if isinstance(term, bool) or not isinstance(term, (int, float)):
                raise NotEvaluable(f"term {node.id!r} of {formula!r} is not a number: {term!r}")
            return term
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                and not node.keywords and node.args):
            return _FUNCTIONS[node.func.id](*(value(a) for a in node.args))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return float(_COMPARE[type(node.ops[0])](value(node.left), value(node.comparators[0])))
        raise NotEvaluable(f"{ast.dump(node)} is not allowed in {formula!r}")

    return value(tree)


def test_the_evaluator_reads_the_estimate_notation_and_nothing_else():
    terms = {"P": 10, "t": 4, "sub": fig(3.0, "x", "3"), "V": 50257}
    assert evaluate("4·P  (fp32 gradients)", terms) == 40
    assert evaluate("2·(t − 1)/t · P", terms) == pytest.approx(15)
    assert evaluate("sub² + ⌈V/t⌉ + ceil(V/t) + min(P, t) + max(1, t)", terms) == 9 + 12565 * 2 + 4 + 4
    assert evaluate("P ≤ t", terms) == 0.0
    for bad in ("__import__('os')", "P.real", "P if t else 0", "[P]", "x + 1", "open(P)", "lambda: 1", "'a'",
                "min(P, key=t)", "(a note only)"):
        with pytest.raises(NotEvaluable):
            evaluate(bad, terms)


# ---- the estimates --------------------------------------------------------------------------------------------
def _with(model, **changes):
    return dataclasses.replace(model, name=model.name + "+" + ",".join(f"{k}={v}" for k, v in changes.items()),
                               **changes)


# (model, cluster, global batch, plans drawn, options, plan space)
_SPACE = SearchSpace(precisions=("bf16", "fp32", "fp16"), max_micro_batch=8, max_virtual_stages=4)
_DEEPSPEED = SearchSpace(precisions=("bf16", "fp32"), engines=("deepspeed",), max_micro_batch=4)
_CASES = [
    (MODELS["tiny"], cluster("A100-SXM-80GB", 1), 16, 80, None, _SPACE),
    (_with(MODELS["tiny"], dropout=0.1), local_cpu_cluster(4), 8, 50, None, _SPACE),
    (_with(MODELS["tiny"], dropout=0.1), cluster("H100-SXM", 1), 16, 50, EstimateOptions(attention="math"), _SPACE),
    (MODELS["tiny-moe"], cluster("A100-SXM-80GB", 1), 16, 60, None, _SPACE),
    (_with(MODELS["tiny-moe"], dropout=0.1, top_k=1), local_cpu_cluster(4), 8, 30, EstimateOptions(
        small_terms=False), _SPACE),
    (MODELS["gpt2-small"], cluster("A100-SXM-80GB", 2), 32, 60, EstimateOptions(
        step_overhead_s=0.01, fragmentation=0.05, dp_overlap=0.3), _SPACE),
    (MODELS["gpt2-small"], cluster("A100-SXM-80GB", 1), 16, 40, None, _DEEPSPEED),
    (_with(MODELS["gpt2-medium"], dropout=0.1), cluster("H100-SXM", 2), 64, 40, EstimateOptions(
        sp_gathered=False, repeat_kv=False, attention="math"), _SPACE),
    (MODELS["gpt2-xl"], cluster("A100-SXM-80GB", 4), 64, 40, None, _SPACE),
    (MODELS["gpt3-1.3b"], cluster("H100-SXM", 4), 128, 40, None, _SPACE),
    (MODELS["gpt3-175b"], cluster("A100-SXM-80GB", 128), 1536, 40, None, _SPACE),
    (MODELS["mixtral-8x7b"], cluster("H100-SXM", 4), 64, 50, None, _SPACE),
    (MODELS["mixtral-8x7b"], cluster("H100-SXM", 2), 32, 20, EstimateOptions(repeat_kv=False), _DEEPSPEED),
    (MODELS["llama3-8b"], cluster("H100-SXM", 2), 64, 30, None, _SPACE),
    (MODELS["tiny-llama"], local_cpu_cluster(4), 8, 30, None, _SPACE),
    (MODELS["tiny-qwen-moe"], local_cpu_cluster(4), 8, 30, None, _SPACE),
]
_MEGATRON = ParallelPlan(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, sequence_parallel=True,
                         precision="bf16", activation_checkpointing="selective", pipeline_schedule="interleaved",
                         virtual_stages=3)


def _plans(model, clus, global_batch, n, space, seed):
    plans = list(enumerate_plans(model, clus, global_batch, space))
    rng = random.Random(seed)
    drawn = rng.sample(plans, min(n, len(plans)))
    for plan in drawn:  # the plan space yields only what the contract accepts; say so where it is relied on
        assert not plan.problems() and not check_plan(model, plan, clus), plan
    return drawn


def training_estimates():
    out = [estimate(MODELS["gpt3-175b"], _MEGATRON, cluster("A100-SXM-80GB", 128, gpu_hour_cost=2.0),
                    token_budget=300e9)]
    for i, (model, clus, batch, n, options, space) in enumerate(_CASES):
        for j, plan in enumerate(_plans(model, clus, batch, n, space, seed=i)):
            out.append(estimate(model, plan, clus, options, token_budget=1e9 if j % 3 == 0 else None))
    # Megatron's published runs: materialised attention, the tensor-parallel overlap, interleaved pipelines
    out += [estimate(r.model, r.plan, r.cluster, r.options) for r in published_runs()]
    return out


def inference_estimates():
    out = []
    for name in ("tiny", "gpt2-small", "gpt3-175b", "mixtral-8x7b"):
        model = MODELS[name]
        for tp in (1, 2, 8):
            if model.kv_heads % tp and tp % model.kv_heads:
                continue
            for precision, kv in (("bf16", None), ("int8", None), ("fp32", "fp16")):
                out.append(inference_estimate(model, cluster("H100-SXM", 1), tp=tp, batch=3, context=1000,
                                              precision=precision, kv_precision=kv))
    return out


def serving_estimates():
    rates = Rates(flop_rate=5e10, bandwidth=1e10)
    host = HostCosts(step_s=2e-3, token_s=3e-4, request_s=5e-3, queue_s=1e-3)
    return [serving_estimate(MODELS[name], rates, host, Load(streams, 16, 32))
            for name in ("tiny", "gpt2-small", "mixtral-8x7b") for streams in (1, 8)]


def estimate_figures(est):
    """(path, figure) of every figure of a training estimate's tree, each once."""
    tops = [(f"parameters.{k}", v) for k, v in est.parameters.items()]
    tops += [(f"flops.{k}", v) for k, v in est.flops.items()]
    tops += [(f"time.{k}", v) for k, v in est.time.items()]
    tops += [(f"budget.{k}", v) for k, v in est.budget.items()]
    tops += [(f"memory.{k}", v) for k, v in est.memory.items() if isinstance(v, Figure)]
    for st in est.memory["stages"]:
        tops += [(f"memory.stage_{st['stage']}.{k}", v) for k, v in st.items() if isinstance(v, Figure)]
    seen = set()
    for top, figure in tops:
        for path, _, f in walk(figure, top):
            if id(f) not in seen:
                seen.add(id(f))
                yield path, f


@pytest.fixture(scope="module")
def trees():
    start = time.perf_counter()
    training = training_estimates()
    serving = inference_estimates()
    figures = [(path, f) for est in training for path, f in estimate_figures(est)]
    figures += [(f"inference.{path}", f) for inf in serving for top, figure in inf.figures.items()
                for path, _, f in walk(figure, top)]
    figures += [(f"serving.{path}", f) for served in serving_estimates() for top, figure in served.items()
                for path, _, f in walk(figure, top)]
    return {"training": training, "serving": serving, "figures": figures,
            "seconds": time.perf_counter() - start}


def _generic(path: str) -> str:
    """A path without its stage number, so that one kind of figure is reported once."""
    return ".".join("stage_N" if p.startswith("stage_") and p[6:].split("_")[0].isdigit() else p
                    for p in path.split("."))


def test_every_formula_evaluated_from_its_terms_equals_the_figure_value(trees):
    wrong: dict[str, str] = {}
    for path, f in trees["figures"]:
        key = _generic(path)
        if key in wrong:
            continue
        try:
            got = evaluate(f.formula, f.terms)
        except (NotEvaluable, ZeroDivisionError, TypeError) as exc:
            wrong[key] = f"cannot evaluate: {exc}"
            continue
        if not math.isclose(got, f.value, rel_tol=REL_TOL, abs_tol=1e-12):
            shown = {k: (v.value if isinstance(v, Figure) else v) for k, v in f.terms.items()}
            wrong[key] = f"{f.formula!r} gives {got!r}, value {f.value!r}, terms {shown}"
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))


def test_sums_are_the_sum_of_their_parts(trees):
    """Figures built by ``total``: the step, a stage's total, buffers, the activations of one micro-batch."""
    for est in trees["training"]:
        step = est.time["step"]
        assert step.value == pytest.approx(sum(f.value for f in step.terms.values() if isinstance(f, Figure)),
                                           rel=REL_TOL)
        for st in est.memory["stages"]:
            for name in ("total", "buffers", "activations_per_microbatch"):
                parts = [v.value for v in st[name].terms.values() if isinstance(v, Figure)]
                assert st[name].value == pytest.approx(sum(parts), rel=REL_TOL, abs=1e-12), name
            assert st["total"].value == pytest.approx(
                sum(st[k].value for k in ("weights", "gradients", "optimizer", "activations", "buffers",
                                          "overhead")), rel=REL_TOL)
    assert total("bytes", {}).value == evaluate(total("bytes", {}).formula, {}) == 0


def test_the_check_covers_hundreds_of_plans_of_every_kind(trees):
    plans = [est.plan for est in trees["training"]]
    assert len(plans) >= 500 and len(trees["serving"]) >= 20
    assert len(trees["figures"]) >= 30_000
    seen = {(p.engine, p.zero_stage) for p in plans}
    assert {("native", 0), ("native", 3), ("deepspeed", 0), ("deepspeed", 1), ("deepspeed", 2),
            ("deepspeed", 3)} <= seen
    assert {p.pipeline_schedule for p in plans if p.pp > 1} == set(get_args(Schedule))
    assert {p.activation_checkpointing for p in plans} == {"none", "selective", "full"}
    assert {p.precision for p in plans} == {"fp32", "bf16", "fp16"}
    assert any(p.tp > 1 for p in plans) and any(p.sequence_parallel for p in plans)
    assert any(p.ep > 1 for p in plans) and any(p.offload_optimizer for p in plans)
    assert sum(p.offload_params for p in plans) >= 10 and any(p.virtual_stages > 1 for p in plans)
    assert any(est.budget for est in trees["training"])
    assert trees["seconds"] < 20


def test_the_gradients_figure_shows_the_vocabulary_split_embeddings_full_gradient():
    """The native trainer's embedding split over t ranks, not also the head, keeps a full V×h gradient: the
    gradients figure says so in its formula instead of showing 4·P_rank beside a larger value."""
    m = MODELS["gpt2-small"]
    plan = ParallelPlan(dp=2, tp=2, pp=2, micro_batch=2, global_batch=16, precision="bf16")
    stage = estimate(m, plan, cluster("A100-SXM-80GB", 1)).memory["stages"][0]
    g = stage["gradients"]
    assert g.value == 4 * g.terms["P_rank"] + (m.vocab_size - -(-m.vocab_size // 2)) * m.d_model * 4
    assert evaluate(g.formula, g.terms) == g.value and "V" in g.formula
