"""Megatron-LM's indexed dataset: token ids in a ``.bin``, their documents in a ``.idx``, so that a prepared
dataset is usable by Megatron-LM and other tools, and a corpus they prepared is usable here.

The ``.bin`` is every document's ids one after another, in the index's dtype. The ``.idx`` is little-endian:

    magic            9 bytes   b"MMIDIDX\\x00\\x00"
    version          uint64    1
    dtype code       uint8     1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    sequences        uint64    S
    document indices uint64    D = documents + 1
    sequence lengths int32[S]  ids in each sequence
    sequence offsets int64[S]  byte offset of each sequence in the .bin
    document indices int64[D]  0, then the sequence count at the end of each document

A document may span several sequences (sentence-split corpora); this product writes one sequence a document.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.data.errors import DataError

BIN, IDX = ".bin", ".idx"
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}
CODE_OF = {np.dtype(t): code for code, t in DTYPE_CODES.items()}
_HEADER = struct.Struct("<9sQBQQ")


@dataclass(frozen=True)
class IndexedDataset:
    """An indexed dataset's index, and its ids as a read-only memmap."""

    bin_path: Path
    dtype: np.dtype
    sequence_lengths: np.ndarray   # int32
    sequence_offsets: np.ndarray   # int64, bytes
    document_indices: np.ndarray   # int64

    @property
    def documents(self) -> int:
        return len(self.document_indices) - 1

    def tokens(self) -> np.memmap:
        """Every id, in order: the documents one after another."""
        return np.memmap(self.bin_path, dtype=self.dtype, mode="r")

    def document(self, i: int) -> np.ndarray:
        """The ids of document ``i`` (all its sequences)."""
        first, end = int(self.document_indices[i]), int(self.document_indices[i + 1])
        if first == end:
            return np.empty(0, dtype=self.dtype)
        start = int(self.sequence_offsets[first]) // self.dtype.itemsize
        count = int(self.sequence_lengths[first:end].sum())
        return np.asarray(self.tokens()[start:start + count])


def write_index(idx_path: Path, dtype: np.dtype | str, document_lengths: np.ndarray) -> None:
    """The .idx of a .bin that holds documents of ``document_lengths`` ids one after another, one sequence each."""
    dtype = np.dtype(dtype)
    if dtype not in CODE_OF:
        raise DataError(f"Megatron's indexed format has no dtype {dtype}")
    lengths = np.asarray(document_lengths, dtype=np.int32)
    offsets = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths):
        np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=offsets[1:])
    with open(idx_path, "wb") as f:
        f.write(_HEADER.pack(MAGIC, VERSION, CODE_OF[dtype], len(lengths), len(lengths) + 1))
        f.write(lengths.tobytes(order="C"))
        f.write(offsets.tobytes(order="C"))
        f.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes(order="C"))


def read_index(path: str | os.PathLike) -> IndexedDataset:
    """The indexed dataset at ``path`` (its .bin, its .idx or their common prefix), checked against its .bin."""
    path = Path(path)
    prefix = path.with_suffix("") if path.suffix in (BIN, IDX) else path
    idx_path, bin_path = prefix.with_suffix(IDX), prefix.with_suffix(BIN)
    for p in (idx_path, bin_path):
        if not p.is_file():
            raise DataError(f"{p} is missing: a Megatron indexed dataset is a .bin and an .idx with the same prefix")
    data = idx_path.read_bytes()
    if len(data) < _HEADER.size or data[:len(MAGIC)] != MAGIC:
        raise DataError(f"{idx_path} is not a Megatron index (it does not start with {MAGIC!r})")
    _, version, code, sequences, doc_count = _HEADER.unpack_from(data)
    if version != VERSION:
        raise DataError(f"{idx_path} is version {version} of Megatron's index; version {VERSION} is read here")
    if code not in DTYPE_CODES:
        raise DataError(f"{idx_path} names dtype code {code}, which Megatron's format does not define")
    need = _HEADER.size + 4 * sequences + 8 * sequences + 8 * doc_count
    if len(data) < need:
        raise DataError(f"{idx_path} is cut short: {len(data):,} bytes where its header asks for {need:,}")
    at = _HEADER.size
    lengths = np.frombuffer(data, np.int32, sequences, at)
    offsets = np.frombuffer(data, np.int64, sequences, at + 4 * sequences)
    documents = np.frombuffer(data, np.int64, doc_count, at + 12 * sequences)
    dtype = np.dtype(DTYPE_CODES[code])
    ends = int(offsets[-1]) + int(lengths[-1]) * dtype.itemsize if sequences else 0
    if bin_path.stat().st_size < ends:
        raise DataError(f"{bin_path} holds {bin_path.stat().st_size:,} bytes but its index places ids up to byte "
                        f"{ends:,}: the two files do not belong together")
    if doc_count < 1 or documents[0] != 0 or documents[-1] != sequences or np.any(np.diff(documents) < 0):
        raise DataError(f"{idx_path} has document indices that do not run from 0 to its {sequences} sequences")
    return IndexedDataset(bin_path, dtype, lengths, offsets, documents)
