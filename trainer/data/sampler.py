"""Batches for every rank: random training windows and fixed validation windows, pure functions of the seed.

``BatchSampler`` depends on (seed, step) only, so a resumed run draws exactly what a straight run drew, and the global
batch of a step is the same set of sequences for any data-parallel degree.
"""
from __future__ import annotations

import math

import numpy as np

from trainer.contract import RunSpec
from trainer.data.errors import DataError


def _windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    idx = offsets[:, None] + np.arange(seq_len + 1)[None, :]
    w = np.asarray(tokens[idx], dtype=np.int64)
    return w[:, :-1], w[:, 1:]


def _n_windows(tokens: np.ndarray, seq_len: int, needed: int, what: str) -> int:
    n = len(tokens) - seq_len  # offsets 0 … len - seq_len - 1 leave room for the shifted target
    if n < needed:
        raise DataError(f"{what} needs {needed} distinct windows of seq_len+1={seq_len + 1} tokens but the "
                        f"{len(tokens)} tokens give only {max(n, 0)}: use more text, a smaller seq_len or batch")
    return n


class BatchSampler:
    """Random windows for one data-parallel rank, a pure function of (seed, step).

    Each step draws the global batch, G = micro_batch × grad_accum × dp_size distinct offsets, from a generator
    seeded by (seed, step). Global sequence g goes to rank g // (micro_batch × grad_accum) and within that rank to
    micro-batch (g mod per_rank) // micro_batch. With the same micro_batch × grad_accum × dp_size, every dp layout
    sees the same sequences in the same global order, so dp=2 reproduces dp=1 (up to reduction order).
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, micro_batch: int, grad_accum: int = 1, dp_rank: int = 0,
                 dp_size: int = 1, seed: int = 0):
        if min(seq_len, micro_batch, grad_accum, dp_size) < 1:
            raise DataError(f"seq_len={seq_len}, micro_batch={micro_batch}, grad_accum={grad_accum} and "
                            f"dp_size={dp_size} must all be positive")
        if not 0 <= dp_rank < dp_size:
            raise DataError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
        self.tokens, self.seq_len, self.micro_batch, self.grad_accum = tokens, seq_len, micro_batch, grad_accum
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.per_rank = micro_batch * grad_accum
        self.global_batch = self.per_rank * dp_size
        self.n_offsets = _n_windows(tokens, seq_len, self.global_batch, "a training step")

    def global_offsets(self, step: int) -> np.ndarray:
        """Start offsets of the whole step's sequences, in global order."""
        rng = np.random.default_rng([self.seed, step])
        return rng.choice(self.n_offsets, size=self.global_batch, replace=False)

    def micro_batches(self, step: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """This rank's grad_accum (x, y) pairs for ``step``; int64 arrays of shape (micro_batch, seq_len)."""
        mine = self.global_offsets(step)[self.dp_rank * self.per_rank:(self.dp_rank + 1) * self.per_rank]
        return [_windows(self.tokens, mine[i * self.micro_batch:(i + 1) * self.micro_batch], self.seq_len)
                for i in range(self.grad_accum)]

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


_BLEND_STREAM = 0xB1E4D  # keeps a blend's draws apart from a single dataset's with the same seed


class BlendSampler(BatchSampler):
    """Random windows from several token streams by weight, for one data-parallel rank, a pure function of
    (seed, step) like ``BatchSampler``, so that a resumed run draws what a straight run drew.

    The first n sequences of the run hold ⌊w_k·n⌋ of each source k but the last, which holds the rest (w_k the
    weights over their sum): over any prefix every source is within a sequence or two of its share, as Megatron-LM's
    blended dataset keeps it. A step's counts are the differences at its two ends; the sources' places in the step
    are shuffled, and each source's windows drawn without repeats, from generators seeded by (seed, step).
    """

    def __init__(self, sources: list[np.ndarray], weights: list[float], seq_len: int, micro_batch: int,
                 grad_accum: int = 1, dp_rank: int = 0, dp_size: int = 1, seed: int = 0):
        super().__init__(sources[0], seq_len, micro_batch, grad_accum, dp_rank, dp_size, seed)
        total = float(sum(weights))
        self.sources, self.shares = sources, [w / total for w in weights]
        self.n_offsets_of = [_n_windows(t, seq_len, self.global_batch, f"blend source {i}")
                             for i, t in enumerate(sources)]

    def counts_before(self, n: int) -> np.ndarray:
        """Sequences of each source among the run's first ``n``."""
        head = [math.floor(share * n + 1e-9) for share in self.shares[:-1]]
        return np.asarray(head + [n - sum(head)], dtype=np.int64)

    def step_sources(self, step: int) -> np.ndarray:
        """The source of each of the step's sequences, in global order."""
        counts = self.counts_before((step + 1) * self.global_batch) - self.counts_before(step * self.global_batch)
        order = np.repeat(np.arange(len(self.sources)), np.maximum(counts, 0))[:self.global_batch]
        return np.random.default_rng([self.seed, step, _BLEND_STREAM]).permutation(order)

    def micro_batches(self, step: int) -> list[tuple[np.ndarray, np.ndarray]]:
        sources = self.step_sources(step)
        windows = np.empty((self.global_batch, self.seq_len + 1), dtype=np.int64)
        for k, tokens in enumerate(self.sources):
            where = np.flatnonzero(sources == k)
            if len(where):
                offsets = np.random.default_rng([self.seed, step, _BLEND_STREAM, k]).choice(
                    self.n_offsets_of[k], size=len(where), replace=False)
                windows[where] = np.asarray(tokens[offsets[:, None] + np.arange(self.seq_len + 1)[None, :]])
        mine = windows[self.dp_rank * self.per_rank:(self.dp_rank + 1) * self.per_rank]
        return [(mine[i * self.micro_batch:(i + 1) * self.micro_batch, :-1],
                 mine[i * self.micro_batch:(i + 1) * self.micro_batch, 1:]) for i in range(self.grad_accum)]


_EVAL_STREAM = 0x5EED_E7A1  # keeps evaluation offsets apart from training steps drawn with the same seed


def eval_batches(tokens: np.ndarray, seq_len: int, batch_size: int, n_batches: int,
                 seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The same n_batches (x, y) batches of validation windows every time they are asked for with this seed."""
    n = _n_windows(tokens, seq_len, batch_size * n_batches, "evaluation")
    offsets = np.sort(np.random.default_rng([seed, _EVAL_STREAM]).choice(n, size=batch_size * n_batches,
                                                                          replace=False))
    return [_windows(tokens, offsets[i * batch_size:(i + 1) * batch_size], seq_len) for i in range(n_batches)]


def unigram_entropy(tokens: np.ndarray) -> float:
    """H = −Σ p·ln p over token frequencies, in nats: the loss of a model that ignores context."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def validation_batches(spec: RunSpec, val_tokens: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The run's evaluation batches. A pipeline evaluates whole groups of grad_accum micro-batches, so the count
    is rounded up to a multiple of it."""
    n = spec.eval_batches
    if spec.plan.pp > 1:
        m = spec.plan.grad_accum
        n = math.ceil(n / m) * m
    return eval_batches(val_tokens, spec.model.seq_len, spec.plan.micro_batch, n, seed=spec.seed)
