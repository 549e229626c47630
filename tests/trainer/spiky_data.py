"""A dataset whose loss spikes at the steps a test chooses, for real: token ids (Megatron's indexed format, with a
tokenizer) that repeat a short cycle, which a tiny model learns in a few dozen steps, but for stretches of random ids
each placed in a window that one chosen batch draws and no other batch of the run does. A batch with such a stretch
costs the model, sure of the cycle by then, several times its usual loss."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trainer.contract import DatasetSpec
from trainer.data import load_tokens, prepare_dataset
from trainer.data.indexed import write_index
from trainer.data.sampler import BatchSampler
from trainer.data.tokenizer import train_tokenizer

CYCLE = np.arange(40, 47, dtype=np.int32)  # the ids the data repeats
TOKENS = 200_000
STRETCH = 24  # random ids in a spiking window, from its 8th token on


def spiky_dataset(folder: Path, vocab: int, seq_len: int, global_batch: int, seed: int, batches: int,
                  spiking: list[int]) -> DatasetSpec:
    """The dataset in ``folder``, whose batches (0-based, as the sampler draws them: batch k is step k + 1's when
    nothing was skipped) in ``spiking`` hold a stretch of random ids, and none other of the first ``batches`` does."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = folder / "tokenizer.json"
    train_tokenizer(iter(["the cycle of ids is all this data holds"] * 50), vocab).save(str(tokenizer))
    ids = np.resize(CYCLE, TOKENS)
    spec = DatasetSpec(path=str(folder / "cycle.bin"), prepared_dir=str(folder / "prepared"), tokenizer=str(tokenizer))
    _write(folder / "cycle", ids)
    train = load_tokens(prepare_dataset(spec, vocab).train_path)
    sampler = BatchSampler(train, seq_len, micro_batch=global_batch, seed=seed)
    drawn = {k: sampler.global_offsets(k) for k in range(batches)}
    rng = np.random.default_rng(seed)
    for k in spiking:
        start = next((int(o) + 8 for o in drawn[k] if not _drawn_elsewhere(drawn, k, int(o) + 8, seq_len)), None)
        assert start is not None, f"every window of batch {k} overlaps another batch's: use more tokens"
        ids[start:start + STRETCH] = rng.integers(CYCLE[-1] + 1, 250, STRETCH)  # within the tokenizer's ids
    _write(folder / "cycle", ids)
    return spec


def _drawn_elsewhere(drawn: dict[int, np.ndarray], k: int, start: int, seq_len: int) -> bool:
    """Whether a batch other than ``k`` draws a window that reaches into ids start … start + STRETCH."""
    return any(int(o) < start + STRETCH and int(o) + seq_len + 1 > start
               for j, offsets in drawn.items() if j != k for o in offsets)


def _write(prefix: Path, ids: np.ndarray) -> None:
    prefix.with_suffix(".bin").write_bytes(ids.astype("<i4").tobytes())
    write_index(prefix.with_suffix(".idx"), np.int32, np.array([len(ids)]))
