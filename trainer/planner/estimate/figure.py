"""A number that says where it came from.

Every figure of an estimate is a ``Figure``: its value, its unit, the formula that produced it and the terms that went
into that formula (numbers or further figures). A reader follows the arithmetic from the top (peak memory per GPU,
step time) down to the model's shape and the plan's degrees. ``to_dict`` is plain JSON.

A formula is an expression over the names of its figure's terms, evaluated from them it gives the value: · or ×
multiply, − subtracts, / divides, ² squares, ⌈x⌉ or ceil(x) and floor(x) round, min and max, ≤ compares (a 0/1
figure). Two spaces end the expression; what follows is a note for the reader, e.g. ``4·P_rank  (fp32 gradients)``.
A ``total`` lists its parts joined by +. tests/trainer/planner/test_figure_formulas.py evaluates every figure of many
estimates this way.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Union

Term = Union["Figure", int, float, str, bool]


@dataclass
class Figure:
    value: float
    unit: str
    formula: str
    terms: dict[str, Term] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "formula": self.formula,
                "terms": {k: (v.to_dict() if isinstance(v, Figure) else v) for k, v in self.terms.items()}}

    def __float__(self) -> float:
        return float(self.value)


def fig(value: float, unit: str, formula: str, **terms: Term) -> Figure:
    return Figure(value, unit, formula, terms)


_NAME = re.compile(r"(?<![\w.])[^\W\d]\w*")   # a name, not the exponent of 5e8
_FUNCTIONS = frozenset(("min", "max", "ceil", "floor"))


def names(formula: str) -> list[str]:
    """The term names a formula's expression (the text before its note) uses."""
    expr = formula.split("  ", 1)[0].replace("²", " ").replace("³", " ")
    return [n for n in _NAME.findall(expr) if n not in _FUNCTIONS]


def symbolic(value: float, unit: str, formula: str, symbols: dict[str, Term], **terms: Term) -> Figure:
    """A figure whose terms are the ``symbols`` its formula names, and ``terms``."""
    found = {n: symbols[n] for n in names(formula) if n in symbols}
    return Figure(value, unit, formula, {**found, **terms})


def total(unit: str, parts: dict[str, Figure], note: str = "") -> Figure:
    """The sum of named parts; the formula lists them by name, ``note`` follows it."""
    formula = " + ".join(parts) or "0"
    return Figure(sum(p.value for p in parts.values()), unit, f"{formula}  ({note})" if note else formula, dict(parts))


def walk(figure: Figure, prefix: str = "", depth: int = 0, max_depth: int = 99):
    """(path, depth, figure) for each figure of a tree, parents first."""
    yield prefix, depth, figure
    if depth >= max_depth:
        return
    for name, term in figure.terms.items():
        if isinstance(term, Figure):
            yield from walk(term, f"{prefix}.{name}" if prefix else name, depth + 1, max_depth)
