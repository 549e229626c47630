"""Arithmetic that can say what it computes: one expression gives both the number and the formula printed beside it.

    a, b = symbols("a b")
    term = Term(2 * (a - 1) / a * b, "a b", "a ring's share")
    term(4, 3)              # 4.5, by a function compiled from the expression
    term.formula            # "2 · (a − 1) / a · b  (a ring's share)", in the notation of ``figure.Figure``

· multiplies, − subtracts, / divides, max, min, ceil and floor; whatever follows two spaces is a note. The function
and the text come from the same tree, so a printed formula is the arithmetic that gave the number (the figure check
evaluates the text back to the value). Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import math
from typing import Callable, Union

Operand = Union["Expr", int, float]

# operator: (precedence, the figures' notation, Python's)
_OPS = {"+": (1, " + ", "+"), "-": (1, " − ", "-"), "*": (2, " · ", "*"), "/": (2, " / ", "/")}


# the functions an expression may call, as the compiled function sees them (the figure check reads the same names)
_FUNCTIONS = {"max": max, "min": min, "ceil": math.ceil, "floor": math.floor}


class Expr:
    precedence = 3

    def text(self) -> str:
        raise NotImplementedError

    def python(self) -> str:
        raise NotImplementedError

    def names(self) -> set[str]:
        raise NotImplementedError

    def __add__(self, other: Operand) -> "Expr":
        return Op("+", self, lift(other))

    def __radd__(self, other: Operand) -> "Expr":
        return Op("+", lift(other), self)

    def __sub__(self, other: Operand) -> "Expr":
        return Op("-", self, lift(other))

    def __rsub__(self, other: Operand) -> "Expr":
        return Op("-", lift(other), self)

    def __mul__(self, other: Operand) -> "Expr":
        return Op("*", self, lift(other))

    def __rmul__(self, other: Operand) -> "Expr":
        return Op("*", lift(other), self)

    def __truediv__(self, other: Operand) -> "Expr":
        return Op("/", self, lift(other))

    def __rtruediv__(self, other: Operand) -> "Expr":
        return Op("/", lift(other), self)


def lift(x: Operand) -> Expr:
    return x if isinstance(x, Expr) else Num(x)


@dataclass(frozen=True, eq=False)
class Sym(Expr):
    name: str

    def text(self) -> str:
        return self.name

    def python(self) -> str:
        return self.name

    def names(self) -> set[str]:
        return {self.name}


@dataclass(frozen=True, eq=False)
class Num(Expr):
    number: float

    def text(self) -> str:
        return str(int(self.number)) if float(self.number).is_integer() else repr(self.number)

    def python(self) -> str:
        return repr(self.number)

    def names(self) -> set[str]:
        return set()


@dataclass(frozen=True, eq=False)
class Op(Expr):
    op: str
    left: Expr
    right: Expr

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return _OPS[self.op][0]

    def text(self) -> str:
        # left-nested chains read without parentheses (a · b / c); a right operand of the same precedence keeps
        # them, so that the text parses back into this very tree
        p = self.precedence
        left, right = self.left.text(), self.right.text()
        if self.left.precedence < p:
            left = f"({left})"
        if self.right.precedence <= p:
            right = f"({right})"
        return left + _OPS[self.op][1] + right

    def python(self) -> str:
        return f"({self.left.python()} {_OPS[self.op][2]} {self.right.python()})"

    def names(self) -> set[str]:
        return self.left.names() | self.right.names()


@dataclass(frozen=True, eq=False)
class Call(Expr):
    function: str
    args: tuple[Expr, ...]

    def text(self) -> str:
        return f"{self.function}({', '.join(a.text() for a in self.args)})"

    def python(self) -> str:
        return f"{self.function}({', '.join(a.python() for a in self.args)})"

    def names(self) -> set[str]:
        return set().union(*(a.names() for a in self.args))


def maximum(*args: Operand) -> Expr:
    return Call("max", tuple(lift(a) for a in args))


def minimum(*args: Operand) -> Expr:
    return Call("min", tuple(lift(a) for a in args))


def ceil(x: Operand) -> Expr:
    """⌈x⌉, an integer."""
    return Call("ceil", (lift(x),))


def floor(x: Operand) -> Expr:
    """⌊x⌋, an integer."""
    return Call("floor", (lift(x),))


def symbols(names: str) -> tuple[Sym, ...]:
    """``symbols("a b c")``: (Sym("a"), Sym("b"), Sym("c"))."""
    return tuple(Sym(n) for n in names.split())


@dataclass(frozen=True, eq=False)
class Term:
    """A named quantity: its expression, a note for the reader, and a function compiled from the expression.

    ``params`` names the symbols in the order the function takes them, positionally: the planner calls terms some
    million times a tuning run, and a positional call is what keeps that cheap. Every symbol of the expression must
    be among them."""

    expr: Expr
    params: str
    note: str = ""
    function: Callable[..., float] = field(init=False, repr=False)

    def __post_init__(self):
        order = self.params.split()
        missing = self.expr.names() - set(order)
        if missing or len(set(order)) != len(order):
            raise ValueError(f"params {order} must name each symbol of {self.expr.text()!r} once")
        code = f"lambda {', '.join(order)}: {self.expr.python()}"
        object.__setattr__(self, "function", eval(code, _FUNCTIONS))  # noqa: S307 - our own text

    def __call__(self, *args: float) -> float:
        return self.function(*args)

    def values(self, args: tuple) -> dict[str, float]:
        """The symbols by name, from the arguments of a call."""
        return dict(zip(self.params.split(), args))

    @property
    def formula(self) -> str:
        return f"{self.expr.text()}  ({self.note})" if self.note else self.expr.text()

    def formula_times(self, count: str) -> str:
        """The formula of ``count`` of this quantity, ``count · (expression)``, its note kept."""
        text = (Sym(count) * self.expr).text()
        return f"{text}  ({self.note})" if self.note else text
