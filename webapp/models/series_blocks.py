"""The arithmetic of the series rollups (webapp.models.series): aligned blocks of steps, their extremes, and the
blocks that tile a step range exactly. No database here.

Level 0 is a step itself; level ``L`` of ``LEVELS`` groups ``4**L`` steps, block ``b`` holding steps
``b·4**L … (b+1)·4**L − 1``. Every block of a level is made of whole blocks of the level below, so a block's
figures are a fold of its children's, and two runs' blocks of one level share their edges.
"""
from __future__ import annotations

from typing import NamedTuple

BASE = 4
LEVELS = (2, 3, 4, 5, 6, 7, 8)  # 16 … 65,536 steps a block
CHAINS = (0, *LEVELS)  # each level's blocks are made of the previous level's


def width(level: int) -> int:
    """Steps in a block of ``level`` (1 for level 0, a step)."""
    return BASE ** level


def finer(level: int) -> int:
    """The level whose blocks make up a block of ``level``."""
    return CHAINS[CHAINS.index(level) - 1]


class Point(NamedTuple):
    value: float
    step: int
    tokens: int | None
    wall: float | None


class Block(NamedTuple):
    """How many points a block holds, and its lowest and highest (the earliest step wins a tie)."""

    count: int
    low: Point
    high: Point

    @classmethod
    def of(cls, point: Point) -> "Block":
        return cls(1, point, point)

    def merged(self, other: "Block | None") -> "Block":
        if other is None:
            return self
        low = min(self.low, other.low, key=lambda p: (p.value, p.step))
        high = max(self.high, other.high, key=lambda p: (p.value, -p.step))
        return Block(self.count + other.count, low, high)


def runs_of(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct ids as maximal runs of consecutive ids, (first, last) each."""
    out: list[tuple[int, int]] = []
    for i in ids:
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def minus(spans: list[tuple[int, int]], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of sorted, disjoint ``spans`` outside sorted, disjoint ``taken`` (all bounds inclusive)."""
    out, j = [], 0
    for lo, hi in spans:
        while j < len(taken) and taken[j][1] < lo:
            j += 1
        k, at = j, lo
        while k < len(taken) and taken[k][0] <= hi:
            if taken[k][0] > at:
                out.append((at, taken[k][0] - 1))
            at = max(at, taken[k][1] + 1)
            k += 1
        if at <= hi:
            out.append((at, hi))
    return out


def parents_and_siblings(children: list[int], child_level: int, level: int) -> tuple[list[int],
                                                                                         list[tuple[int, int]]]:
    """For sorted distinct ``children`` (blocks of ``child_level``) that changed: the blocks of ``level`` that hold
    them, and the ranges of their other children, which must be read back to fold the parents again."""
    ratio = width(level) // width(child_level)
    parents = sorted({c // ratio for c in children})
    spans = [(lo * ratio, (hi + 1) * ratio - 1) for lo, hi in runs_of(parents)]
    return parents, minus(spans, runs_of(children))


def cover(first: int, last: int, top: int) -> list[tuple[int, int, int]]:
    """The blocks that tile steps ``first … last`` exactly, as (level, first block, last block): whole blocks of
    ``top`` in the middle, and at each ragged end the fewest finer blocks, down to single steps (level 0)."""
    parts: list[tuple[int, int, int]] = []
    lo, hi = first, last + 1  # half-open from here on
    chain = [level for level in CHAINS if level <= top]
    for fine, coarse in zip(chain, chain[1:]):
        wf, wc = width(fine), width(coarse)
        up = min(-(-lo // wc) * wc, hi)
        if lo < up:
            parts.append((fine, lo // wf, up // wf - 1))
            lo = up
        down = max(hi // wc * wc, lo)
        if down < hi:
            parts.append((fine, down // wf, hi // wf - 1))
            hi = down
    if lo < hi:
        parts.append((top, lo // width(top), hi // width(top) - 1))
    return parts


def level_for(first: int, last: int, max_blocks: int, max_steps: int) -> int:
    """The level a chart of steps ``first … last`` reads: its step rows when there are at most ``max_steps``,
    otherwise the finest level at which the range spans at most ``max_blocks`` blocks (the coarsest if none)."""
    if last - first + 1 <= max_steps:
        return 0
    for level in LEVELS:
        if last // width(level) - first // width(level) + 1 <= max_blocks:
            return level
    return LEVELS[-1]
