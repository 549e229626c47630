"""A number that says where it came from.

Every figure of an estimate is a ``Figure``: its value, its unit, the formula that produced it and the terms that went
into that formula (numbers or further figures). A reader follows the arithmetic from the top (peak memory per GPU,
step time) down to the model's shape and the plan's degrees. ``to_dict`` is plain JSON.
"""
from __future__ import annotations

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


def total(unit: str, parts: dict[str, Figure], formula: str = "") -> Figure:
    """The sum of named parts; the formula lists them by name."""
    return Figure(sum(p.value for p in parts.values()), unit, formula or " + ".join(parts) or "0", dict(parts))


def walk(figure: Figure, prefix: str = "", depth: int = 0, max_depth: int = 99):
    """(path, depth, figure) for each figure of a tree, parents first."""
    yield prefix, depth, figure
    if depth >= max_depth:
        return
    for name, term in figure.terms.items():
        if isinstance(term, Figure):
            yield from walk(term, f"{prefix}.{name}" if prefix else name, depth + 1, max_depth)
