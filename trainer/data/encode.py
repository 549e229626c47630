"""Text → ids for a whole corpus: cut into shards, encoded by worker processes, kept shard by shard so that a crash
loses only the shards in flight, then joined in order.

A shard is one ``Part`` of one file (``sources.parts``: plain JSONL and text by byte ranges, Parquet by row groups,
a compressed file whole). A worker encodes its shard's documents (the end-of-text id between two of them) into
``<work>/<n>.bin`` with their lengths and its row report in ``<n>.json``, written last: a shard whose .json exists is
done, and a preparation started again over the same work folder (same source, tokenizer, field and shard size) keeps
it. The join adds the end-of-text id between the last document of one shard and the first of the next, so the ids
are those of one process reading the files in order.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from trainer.data.errors import DataError
from trainer.data.sources import Part, RowReport, parts, pieces
from trainer.data.tokenizer import load_tokenizer

SHARD_BYTES = 64 << 20      # source bytes a shard holds, about
NO_EOS = ("the tokenizer has no end-of-text token to join documents with: give one document, or a tokenizer whose "
          "tokenizer_config.json names its eos_token")
BATCH_PIECES = 64           # pieces encoded together: many short documents make one call
BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class Shard:
    number: int
    label: str
    path: str
    part: Part


@dataclass
class Encoded:
    """What the shards together hold: each document's length, bytes of text, whether any was more than white space,
    the row report."""

    lengths: np.ndarray   # int64, one a document
    n_bytes: int
    has_text: bool
    report: RowReport


def plan_shards(units: list[tuple[str, Path]], shard_bytes: int = SHARD_BYTES) -> list[Shard]:
    out = []
    for label, path in units:
        for part in parts(path, shard_bytes):
            out.append(Shard(len(out), label, str(path), part))
    return out


def work_folder(out: Path, key: str) -> Path:
    """Where the shards of one preparation live: one folder per key (source, tokenizer, field, shard size); others
    are what an earlier, different preparation left, removed."""
    root = out / ".shards"
    root.mkdir(exist_ok=True)
    for old in root.iterdir():
        if old.name != key:
            shutil.rmtree(old, ignore_errors=True)
    folder = root / key
    folder.mkdir(exist_ok=True)
    return folder


def shard_key(*parts_of_key) -> str:
    return hashlib.sha256(json.dumps(parts_of_key).encode()).hexdigest()[:16]


def encode_shard(shard: Shard, tokenizer: str, dtype: str, text_field: str, folder: str) -> int:
    """One shard's ids into ``folder`` (see the module docstring); its number. Runs in a worker process."""
    done = Path(folder) / f"{shard.number}.json"
    if done.is_file():
        return shard.number
    tok = load_tokenizer(tokenizer)
    report = RowReport()
    lengths: list[int] = []
    pending: list[tuple[bool, str]] = []
    n_bytes, has_text, chars = 0, False, 0
    continues = False  # the shard's first piece goes on with the document the previous shard ended in
    ids_tmp = Path(folder) / f".{shard.number}.bin.{os.getpid()}"
    with open(ids_tmp, "wb") as f:
        def flush() -> None:
            nonlocal continues
            batch, count = [], 0  # the batch's ids, written in one go: a write a document costs a tenth of the time
            for (starts, _), ids in zip(pending, tok.encode_batch([piece for _, piece in pending])):
                if starts and lengths:  # the end-of-text id between two documents
                    if tok.eos_id is None:
                        raise DataError(NO_EOS)
                    batch.append((tok.eos_id,))
                    lengths[-1] += 1
                    count += 1
                if starts or not lengths:
                    continues = continues or not lengths and not starts
                    lengths.append(0)
                batch.append(ids)
                lengths[-1] += len(ids)
                count += len(ids)
            f.write(np.fromiter(itertools.chain.from_iterable(batch), dtype=dtype, count=count).tobytes())
            pending.clear()

        for starts, piece in pieces(Path(shard.path), shard.label, text_field, report, shard.part):
            n_bytes += len(piece) if piece.isascii() else len(piece.encode("utf-8"))  # isascii: no scan
            has_text = has_text or (bool(piece) and not piece.isspace())
            pending.append((starts, piece))
            chars += len(piece)
            if len(pending) >= BATCH_PIECES or chars >= BATCH_CHARS:
                flush()
                chars = 0
        flush()
    os.replace(ids_tmp, Path(folder) / f"{shard.number}.bin")
    np.save(Path(folder) / f"{shard.number}.lengths.npy", np.asarray(lengths, dtype=np.int64))
    summary = {"bytes": n_bytes, "has_text": has_text, "continues": continues, "report": report.to_dict()}
    tmp = Path(folder) / f".{shard.number}.json.{os.getpid()}"
    tmp.write_text(json.dumps(summary))
    os.replace(tmp, done)
    return shard.number


def encode_all(shards: list[Shard], tokenizer: Path, dtype: str, text_field: str, folder: Path, out_file,
               eos_id: int | None, workers: int, progress: Callable[[int, int], None] | None = None) -> Encoded:
    """Every shard encoded (by ``workers`` processes when more than one shard is left), then joined into
    ``out_file`` in order."""
    left = [s for s in shards if not (folder / f"{s.number}.json").is_file()]
    done = len(shards) - len(left)
    if progress:
        progress(done, len(shards))
    args = (str(tokenizer), dtype, text_field, str(folder))
    if workers > 1 and len(left) > 1:
        # spawn, not fork: the caller may be a trainer rank with torch's threads running
        with ProcessPoolExecutor(min(workers, len(left)), mp_context=multiprocessing.get_context("spawn")) as pool:
            for future in as_completed([pool.submit(encode_shard, s, *args) for s in left]):
                future.result()
                done += 1
                if progress:
                    progress(done, len(shards))
    else:
        for s in left:
            encode_shard(s, *args)
            done += 1
            if progress:
                progress(done, len(shards))
    return _join(shards, folder, out_file, dtype, eos_id)


def _join(shards: list[Shard], folder: Path, out_file, dtype: str, eos_id: int | None) -> Encoded:
    report, n_bytes, has_text = RowReport(), 0, False
    lengths: list[np.ndarray] = []  # each shard's documents' lengths, as they are joined
    for s in shards:
        summary = json.loads((folder / f"{s.number}.json").read_text())
        report.merge(RowReport.from_dict(summary["report"]))
        n_bytes += summary["bytes"]
        has_text = has_text or summary["has_text"]
        shard_lengths = np.load(folder / f"{s.number}.lengths.npy")
        if not len(shard_lengths):
            continue
        continues = summary["continues"] and bool(lengths)
        if lengths and not continues:  # the end-of-text id between the shards' documents
            if eos_id is None:
                raise DataError(NO_EOS)
            np.array([eos_id], dtype=dtype).tofile(out_file)
            lengths[-1][-1] += 1
        with open(folder / f"{s.number}.bin", "rb") as f:
            shutil.copyfileobj(f, out_file, 1 << 22)
        if continues:  # a text file read in parts: its document goes on
            lengths[-1][-1] += shard_lengths[0]
            shard_lengths = shard_lengths[1:]
        if len(shard_lengths):
            lengths.append(shard_lengths)
    joined = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return Encoded(joined, n_bytes, has_text, report)
