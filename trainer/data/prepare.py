"""Text → token ids on disk: ``prepare_dataset`` turns a text file, or a folder of text files, into:

    <prepared dir>/
      tokenizer.json   byte-level BPE (HF tokenizers), with one special token <|endoftext|> (the EOS/separator)
      train.bin        token ids, flat, uint16 when the vocabulary fits in 16 bits, else uint32
      val.bin          the last ``val_fraction`` of the token stream: contiguous, so no text leaks across the split
      meta.json        source sha256, files, vocab sizes, dtype, token counts, val fraction; written last

The prepared dir is ``DatasetSpec.prepared_dir`` when set (the files go straight into it), otherwise
``<path>.prepared/vocab-<N>`` beside the file or folder, so that two vocabulary sizes never overwrite each other.
A run started from a checkpoint that keeps its tokenizer (``RunSpec.init_from``) passes that tokenizer.json: it is
copied in instead of trained, and the files go to ``tokenizer-<sha256[:12]>`` of its bytes, inside the prepared dir
when set, else in ``<path>.prepared/`` (unless the prepared dir's own tokenizer is that very file).
Files of a folder are taken recursively in sorted order of their relative paths (hidden files skipped), each encoded
on its own and joined with the EOS id.

Preparation is idempotent: it is redone only when the text (sha256 of names and bytes; files whose size and mtime
are unchanged are not read again) or the vocabulary changes, and a new val_fraction reuses the tokenizer. A read-only
prepared folder that is up to date is used as it is. It is safe to call from every rank of a job at once: an
exclusive ``fcntl`` lock on ``<prepared dir>/.lock`` lets one process do the work while the others wait and then find
a matching meta.json. Each file is written under a temporary name and renamed into place, meta.json last, so a reader
that sees meta.json sees complete files. (``flock`` is only as good as the file system's locking: local disks and
most cluster file systems honour it; an NFS without lock support does not.)
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from trainer.contract.datapath import DataPathError, data_files
from trainer.data import indexed
from trainer.data.encode import encode_all, plan_shards, shard_key, work_folder
from trainer.data.errors import DataError
from trainer.data.sources import RowReport, kind_of, pieces
from trainer.data.tokenizer import (BYTE_ALPHABET, MIN_VOCAB, SPECIALS, TOKENIZER, TOKENIZER_CONFIG, load_tokenizer,
                                    resolve_tokenizer, train_tokenizer)

FORMAT_VERSION = 2  # 2: each .bin has Megatron's .idx beside it; sources may be JSONL, Parquet or indexed
TRAIN, VAL, META, LOCK = "train.bin", "val.bin", "meta.json", ".lock"
_COPY_IDS = 1 << 24          # ids copied at a time: memory stays bounded whatever the corpus


@dataclass(frozen=True)
class PreparedData:
    train_path: Path
    val_path: Path
    tokenizer_path: Path
    vocab_size: int  # the tokenizer's real vocabulary (≤ the model's embedding size)
    dtype: str  # "uint16" or "uint32"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def eos_id(self) -> int:
        return int(self.meta["eos_id"])

    def train_tokens(self) -> np.memmap:
        return load_tokens(self.train_path)

    def val_tokens(self) -> np.memmap:
        return load_tokens(self.val_path)


# ---------------------------------------------------------------- source files


def dataset_path(path: Path) -> Path:
    """The dataset ``path`` names. A Megatron dataset is a pair, X.bin (the tokens) and X.idx (its index), and its
    users name it by either: by its index, it is its .bin, which must be beside it."""
    if path.suffix != indexed.IDX or not path.is_file():
        return path
    tokens = path.with_suffix(indexed.BIN)
    if not tokens.is_file():
        raise DataError(f"dataset path {path} is the index of a Megatron dataset, whose tokens are in {tokens.name}, "
                        f"which is not beside it: put {tokens.name} next to {path.name}, or set dataset.path to the "
                        f"dataset's .bin file")
    return tokens


def _source_files(path: Path, prepared_dir: Path) -> list[Path]:
    """The files to read, checked by the contract's one rule for dataset paths (regular files only, no link out of
    the folder) just before they are read."""
    if not path.exists():
        raise DataError(f"dataset path {path} does not exist: set dataset.path to a text file or a folder of them")
    try:
        found = data_files(path)
    except DataPathError as exc:
        raise DataError(str(exc)) from None
    if path.is_file():
        if kind_of(path) == "megatron":  # its index too: both are the source
            try:
                return found + data_files(path.with_suffix(indexed.IDX))
            except DataPathError as exc:
                raise DataError(str(exc)) from None
        return found
    skip = prepared_dir.resolve()
    # a prepared dir placed inside the dataset folder is not data
    files = [f for f in found if skip not in f.resolve().parents]
    if not files:
        raise DataError(f"dataset folder {path} holds no files: put text files in it or point dataset.path at a file")
    return files


def _source_hash(path: Path, files: list[Path]) -> str:
    """sha256 over each file's relative name and bytes: renaming, reordering or editing a file changes it."""
    h = hashlib.sha256()
    for f in files:
        rel = f.name if path.is_file() else f.relative_to(path).as_posix()
        h.update(rel.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def _units(path: Path, files: list[Path]) -> list[tuple[str, Path]]:
    """The files to read with their names in the dataset, an indexed dataset's .idx left to its .bin; one kind of
    content only: token ids (indexed) and text are not mixed."""
    units = [(f.name if path.is_file() else f.relative_to(path).as_posix(), f) for f in files
             if not (f.suffix == indexed.IDX and f.with_suffix(indexed.BIN).is_file())]
    indexed_ones = [label for label, f in units if kind_of(f) == "megatron"]
    if indexed_ones and len(indexed_ones) < len(units):
        raise DataError(f"dataset {path} mixes Megatron indexed files (token ids: {indexed_ones[0]}) with text "
                        f"files; prepare them as two datasets")
    return units


def _text_pieces(units: list[tuple[str, Path]], text_field: str, report: RowReport) -> Iterator[str]:
    for label, f in units:
        for _, piece in pieces(f, label, text_field, report):
            yield piece


# ---------------------------------------------------------------- preparation


def default_prepared_dir(path: str | os.PathLike, vocab_size: int) -> Path:
    """Where prepared files go when the spec does not say: ``<path>.prepared/vocab-<N>`` beside the source."""
    path = Path(path)
    return path.parent / f"{path.name}.prepared" / f"vocab-{vocab_size}"


def _dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "uint32"


def _tmp_path(target: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    return Path(tmp)


def _publish(tmp: Path, target: Path) -> None:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)  # mkstemp makes files private; other users (web app, Triton) read these
    os.replace(tmp, target)


def _write_json(target: Path, data: Any) -> None:
    tmp = _tmp_path(target)
    tmp.write_text(json.dumps(data, indent=2))
    _publish(tmp, target)


def _read_meta(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / META).read_text())
    except (FileNotFoundError, ValueError):
        return None


def _source_stat(path: Path, files: list[Path]) -> list[list]:
    return [[f.name if path.is_file() else f.relative_to(path).as_posix(), st.st_size, st.st_mtime_ns]
            for f in files for st in [f.stat()]]


def _source_sha(path: str | Path, files: list[Path], stat: list[list], meta: dict | None) -> str:
    """The source's sha256; taken from meta when no file changed size or mtime since, because every rank of every
    launch asks, and hashing a large corpus each time would cost minutes."""
    if meta and meta.get("source_stat") == stat and meta.get("source_sha256"):
        return meta["source_sha256"]
    return _source_hash(Path(path), files)


def _reusable(out: Path, meta: dict | None, source_sha: str, vocab: int, val_fraction: float,
              tokenizer_sha: str | None = None, text_field: str = "text") -> str:
    """What a previous preparation in ``out`` still serves: 'all', 'tokenizer' (same text and vocabulary, another
    split) or 'nothing'. ``tokenizer_sha``: the given tokenizer's (None: one trained here); a folder whose tokenizer
    is that very file serves it, whether it was given or trained here (a checkpoint of a run on this dataset)."""
    if not meta or meta.get("format_version") != FORMAT_VERSION or meta.get("source_sha256") != source_sha \
            or meta.get("text_field") != text_field:
        return "nothing"
    if tokenizer_sha is None:
        if meta.get("requested_vocab") != vocab or meta.get("tokenizer_source"):
            return "nothing"
    elif (meta.get("tokenizer_sha256") or _file_sha(out / TOKENIZER)) != tokenizer_sha:
        return "nothing"
    if meta.get("val_fraction") != val_fraction or not all((out / n).is_file() for n in (TRAIN, VAL)):
        return "tokenizer" if (out / TOKENIZER).is_file() else "nothing"
    return "all" if (out / TOKENIZER).is_file() else "nothing"


def _file_sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _given_tokenizer(tokenizer: str | os.PathLike, vocab_size: int) -> tuple[Path, str, int]:
    """A tokenizer.json to tokenize with, checked: its path, the sha256 of its bytes, its vocabulary size."""
    path = resolve_tokenizer(Path(tokenizer).expanduser())
    tok = load_tokenizer(path)
    if tok.vocab_size > vocab_size:
        raise DataError(f"the tokenizer {path} has {tok.vocab_size} tokens but model.vocab_size={vocab_size}: token "
                        f"ids would not fit the embedding")
    return path, _file_sha(path), tok.vocab_size


def prepare_dataset(spec, vocab_size: int, tokenizer: str | os.PathLike | None = None, *, workers: int | None = None,
                    progress: Callable[[int, int], None] | None = None) -> PreparedData:
    """Tokenize ``spec.path`` into train/val token files (see the module docstring); reuse them when up to date.

    ``vocab_size`` is the model's embedding size; the tokenizer is trained for ``spec.tokenizer_vocab`` tokens
    when set, else for ``vocab_size``, and must not have more than ``vocab_size``. An existing tokenizer is used as
    it is instead: ``spec.tokenizer`` (a tokenizer.json, or a folder with one or with GPT-2's vocab.json and
    merges.txt), else ``tokenizer`` (a checkpoint's, for a run that starts from it); ``spec.tokenizer_vocab`` is
    then not used. Given both, they must be the same tokenizer.

    ``workers``: processes that encode the shards (default: one a CPU core); ``progress(done, shards)`` is called as
    shards finish.
    """
    how = {"workers": workers, "progress": progress}
    if spec.tokenizer:
        chosen = _given_tokenizer(spec.tokenizer, vocab_size)
        if tokenizer is not None and _given_tokenizer(tokenizer, vocab_size)[1] != chosen[1]:
            raise DataError(f"dataset.tokenizer={spec.tokenizer} is not the tokenizer of the checkpoint the run starts "
                            f"from ({tokenizer}): its ids would mean other tokens to the model; leave "
                            f"dataset.tokenizer empty to keep the checkpoint's")
        return _prepare_with(spec, vocab_size, *chosen, **how)
    if tokenizer is not None:
        return _prepare_with(spec, vocab_size, *_given_tokenizer(tokenizer, vocab_size), **how)
    return _prepare_with(spec, vocab_size, None, None, spec.tokenizer_vocab or vocab_size, **how)


def _prepare_with(spec, vocab_size: int, given: Path | None, given_sha: str | None, requested: int,
                  workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> PreparedData:
    if requested < MIN_VOCAB and given is None:
        raise DataError(f"a byte-level BPE vocabulary needs at least {BYTE_ALPHABET} byte tokens + {len(SPECIALS)} "
                        f"special = {MIN_VOCAB} tokens; got {requested}: raise "
                        f"{'dataset.tokenizer_vocab' if spec.tokenizer_vocab else 'model.vocab_size'}")
    if requested > vocab_size:
        raise DataError(f"dataset.tokenizer_vocab={requested} is larger than model.vocab_size={vocab_size}: token ids "
                        f"would not fit the embedding; lower tokenizer_vocab or raise model.vocab_size")
    if not 0.0 < spec.val_fraction < 0.5:
        raise DataError(f"dataset.val_fraction={spec.val_fraction} must be in (0, 0.5)")
    path = dataset_path(Path(spec.path).expanduser())
    out = Path(spec.prepared_dir).expanduser() if spec.prepared_dir else default_prepared_dir(path, requested)
    if given_sha is not None and _file_sha(out / TOKENIZER) != given_sha:
        # another tokenizer's files: beside the dataset's own, never over them
        out = (out if spec.prepared_dir else out.parent) / f"tokenizer-{given_sha[:12]}"
    files = _source_files(path, out)
    stat = _source_stat(path, files)
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / LOCK, "a+")
    except OSError as exc:
        # A read-only folder prepared elsewhere (a shared dataset copy) still serves if it is up to date.
        meta = _read_meta(out)
        if _reusable(out, meta, _source_sha(path, files, stat, meta), requested, spec.val_fraction,
                     given_sha, spec.text_field) == "all":
            return _prepared(out, meta, vocab_size)
        raise DataError(f"cannot write in the prepared-data folder {out} ({exc.strerror}): set "
                        f"dataset.prepared_dir to a writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        meta = _read_meta(out)
        source_sha = _source_sha(path, files, stat, meta)
        reuse = _reusable(out, meta, source_sha, requested, spec.val_fraction, given_sha, spec.text_field)
        if reuse != "all":
            if given is not None and reuse == "nothing":
                _copy_tokenizer(given, out)
            meta = _build(spec, path, files, out, source_sha, stat, requested,
                          reuse_tokenizer=reuse == "tokenizer" or given is not None,
                          given=(given, given_sha) if given is not None else None, workers=workers,
                          progress=progress)
        elif meta.get("source_stat") != stat:  # touched but unchanged: remember, so the next call needs no hash
            meta = {**meta, "source_stat": stat}
            _write_json(out / META, meta)
    return _prepared(out, meta, vocab_size)


def _prepared(out: Path, meta: dict[str, Any], vocab_size: int) -> PreparedData:
    if meta["vocab_size"] > vocab_size:
        raise DataError(f"the tokenizer in {out} has {meta['vocab_size']} tokens but model.vocab_size={vocab_size}: "
                        f"raise model.vocab_size to at least {meta['vocab_size']}")
    return PreparedData(train_path=out / TRAIN, val_path=out / VAL, tokenizer_path=out / TOKENIZER,
                        vocab_size=meta["vocab_size"], dtype=meta["dtype"], meta=meta)


def _copy_tokenizer(given: Path, out: Path) -> None:
    """The given tokenizer.json (and the tokenizer_config.json beside it, which may name its eos token) copied into
    the prepared folder, so the run's checkpoints name a tokenizer that stays where their data is."""
    (out / META).unlink(missing_ok=True)  # it no longer vouches for the folder's files
    for name, source in ((TOKENIZER, given), (TOKENIZER_CONFIG, given.parent / TOKENIZER_CONFIG)):
        if name == TOKENIZER_CONFIG and not source.is_file():
            (out / name).unlink(missing_ok=True)
            continue
        tmp = _tmp_path(out / name)
        shutil.copyfile(source, tmp)
        _publish(tmp, out / name)


def _build(spec, path: Path, files: list[Path], out: Path, source_sha: str, stat: list[list], requested: int,
           reuse_tokenizer: bool, given: tuple[Path, str] | None = None, workers: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    # A meta.json that no longer describes the files must go first: a crash half-way must not leave it vouching
    # for a mix of old and new files.
    (out / META).unlink(missing_ok=True)
    units = _units(path, files)
    token_ids = kind_of(units[0][1]) == "megatron"
    if token_ids and given is None:
        raise DataError(f"dataset {path} is a Megatron indexed dataset: its documents are token ids already. Give "
                        f"the tokenizer they were made with (dataset.tokenizer), so that the model's checkpoints "
                        f"can read and write text")
    if reuse_tokenizer:
        tok = load_tokenizer(out / TOKENIZER)
    else:
        # the first pass over the text trains the tokenizer; a source with too many bad rows stops here
        report = RowReport()
        tmp = _tmp_path(out / TOKENIZER)
        train_tokenizer(_text_pieces(units, spec.text_field, report), requested).save(str(tmp))
        report.check(str(path), spec.max_bad_fraction)
        _publish(tmp, out / TOKENIZER)
        tok = load_tokenizer(out / TOKENIZER)
    t_train = time.perf_counter() - t0
    dtype = _dtype_for(tok.vocab_size)

    # Stream all ids into one temporary file, then cut it: the split point needs the total count.
    all_tmp = _tmp_path(out / "all.bin")
    report = RowReport()
    try:
        with open(all_tmp, "wb") as f:
            if token_ids:
                lengths, n_bytes, has_text = _copy_indexed(units, f, dtype, tok.vocab_size), 0, True
                report.rows = len(lengths)
            else:
                shards = plan_shards(units)
                key = shard_key(FORMAT_VERSION, source_sha, _file_sha(out / TOKENIZER), spec.text_field, dtype,
                                [(s.label, s.part.start, s.part.end) for s in shards])
                folder = work_folder(out, key)
                encoded = encode_all(shards, out / TOKENIZER, dtype, spec.text_field, folder, f, tok.eos_id,
                                     workers or len(os.sched_getaffinity(0)), progress)
                lengths, n_bytes, has_text, report = (encoded.lengths, encoded.n_bytes, encoded.has_text,
                                                      encoded.report)
        report.check(str(path), spec.max_bad_fraction)
        if not has_text:
            raise DataError(f"dataset {path} has no text (only empty or blank documents): nothing to train on")
        itemsize = np.dtype(dtype).itemsize
        n = all_tmp.stat().st_size // itemsize
        n_val = int(math.ceil(n * spec.val_fraction))
        if n - n_val < 2 or n_val < 2:
            raise DataError(f"dataset {path} gives only {n} tokens: too few for a train/val split at "
                            f"val_fraction={spec.val_fraction}; add text")
        train_lengths, val_lengths = _cut_documents(lengths, n - n_val)
        for name, (start, end), part_lengths in ((TRAIN, (0, n - n_val), train_lengths),
                                                 (VAL, (n - n_val, n), val_lengths)):
            tmp = _tmp_path(out / name)
            with open(all_tmp, "rb") as source, open(tmp, "wb") as f:  # read, not mapped: memory stays flat
                source.seek(start * itemsize)
                left = (end - start) * itemsize
                while left:
                    block = source.read(min(left, _COPY_IDS * itemsize))
                    f.write(block)
                    left -= len(block)
            index = _tmp_path(out / name)
            indexed.write_index(index, dtype, part_lengths)
            _publish(index, (out / name).with_suffix(indexed.IDX))
            _publish(tmp, out / name)
    finally:
        all_tmp.unlink(missing_ok=True)
    shutil.rmtree(out / ".shards", ignore_errors=True)  # the shards were kept for a crash; the files now hold them

    meta = {
        "format_version": FORMAT_VERSION,
        "source": str(path.resolve()),
        "source_files": [f.name if path.is_file() else f.relative_to(path).as_posix() for f in files],
        "source_kinds": sorted({kind_of(f) for _, f in units}),
        "source_sha256": source_sha,
        "source_stat": stat,  # [name, size, mtime_ns] per file: unchanged files need no rehash
        "source_bytes": n_bytes,
        "text_field": spec.text_field,
        "documents": len(lengths),
        "bad_rows": report.to_dict(),
        "requested_vocab": requested,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype,
        "tokens": n,
        "train_tokens": n - n_val,
        "val_tokens": n_val,
        "val_fraction": spec.val_fraction,
        "bytes_per_token": n_bytes / n,
        "tokenizer_reused": reuse_tokenizer,
        **({"tokenizer_source": str(given[0].resolve()), "tokenizer_sha256": given[1]} if given else {}),
        "tokenizer_train_s": round(t_train, 3),
        "prepare_s": round(time.perf_counter() - t0, 3),
    }
    _write_json(out / META, meta)
    return meta


def _copy_indexed(units: list[tuple[str, Path]], f, dtype: str, vocab_size: int) -> np.ndarray:
    """The ids of Megatron indexed datasets, as they are, into ``f``; their documents' lengths. Ids the tokenizer
    does not have are refused: the data was made with another one."""
    lengths: list[np.ndarray] = []
    for label, source in units:
        data = indexed.read_index(source)
        ends = np.concatenate([[0], np.cumsum(data.sequence_lengths, dtype=np.int64)])
        if np.any(data.sequence_offsets != ends[:-1] * data.dtype.itemsize):
            raise DataError(f"{label}: its sequences are not stored one after another in its .bin; rewrite it with "
                            f"Megatron-LM's preprocessing")
        tokens = data.tokens()
        for start in range(0, len(tokens), _COPY_IDS):
            chunk = np.asarray(tokens[start:start + _COPY_IDS])
            if len(chunk) and (chunk.min() < 0 or chunk.max() >= vocab_size):
                raise DataError(f"{label} holds token id {int(chunk.max())}, but the tokenizer has {vocab_size} "
                                f"tokens: give the tokenizer the dataset was made with (dataset.tokenizer)")
            chunk.astype(dtype).tofile(f)
        lengths.append(ends[data.document_indices[1:]] - ends[data.document_indices[:-1]])
    return np.concatenate(lengths)


def _cut_documents(lengths: np.ndarray, cut: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents' lengths on either side of id ``cut``: the document it falls in is split in two."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    inside = int(np.searchsorted(ends, cut, side="right"))  # documents that end at or before the cut
    taken = int(ends[inside - 1]) if inside else 0
    if taken == cut:
        return lengths[:inside], lengths[inside:]
    val = lengths[inside:].copy()
    val[0] -= cut - taken  # the cut falls inside document ``inside``
    return np.append(lengths[:inside], cut - taken), val


def load_tokens(path: str | os.PathLike, dtype: str | None = None) -> np.memmap:
    """A train.bin or val.bin as a read-only memmap; the dtype comes from the meta.json beside it."""
    path = Path(path)
    if dtype is None:
        meta = _read_meta(path.parent)
        if meta is None:
            raise DataError(f"no {META} beside {path}: prepare the dataset first, or pass dtype")
        dtype = meta["dtype"]
    return np.memmap(path, dtype=dtype, mode="r")
