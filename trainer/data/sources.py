"""What a dataset's files hold, read as documents, with the rows that could not be read counted and located.

A file's kind follows its name:

    *.jsonl, *.jsonl.gz, *.jsonl.zst   one JSON object per line; the document is the string under ``text_field``
    *.parquet                           one row per document; the document is the string column ``text_field``,
                                        read one row-group batch at a time (pyarrow)
    *.bin beside *.idx                  Megatron-LM's indexed dataset: documents already token ids (``indexed``)
    anything else                       UTF-8 text, the whole file one document

A JSONL or Parquet row that is not JSON, lacks the field, holds no string there or is not UTF-8 is a bad row: it
is skipped, counted, and the first few are kept with their place (``chat.jsonl:7: not JSON (…)``), so a report can
say what to fix. ``RowReport.check`` refuses a source whose share of bad rows is above the dataset's limit.

Everything streams, as pieces of at most about a megabyte of text: memory stays bounded whatever the size of a
file or a document. A file can be read in ``Part``s, so that several processes share a large one: a plain JSONL or
text file by byte ranges (a line, or a piece, belongs to the part its first byte lies in), a Parquet file by row
groups; a compressed file is one part.
"""
from __future__ import annotations

import codecs
import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from trainer.data import indexed
from trainer.data.errors import DataError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
PARQUET_SUFFIX = ".parquet"
FIRST_BAD_ROWS = 5          # bad rows kept with their place, for the report
PARQUET_BATCH_ROWS = 1024   # rows read at a time from a Parquet file
PIECE_CHARS = 1 << 20       # text is tokenized in pieces of about this many characters, cut at a line break


def kind_of(path: Path) -> str:
    """'jsonl', 'parquet', 'megatron' or 'text', by the file's name (and, for Megatron, its .idx partner)."""
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIX):
        return "parquet"
    if name.endswith(indexed.BIN) and path.with_suffix(indexed.IDX).is_file():
        return "megatron"
    return "text"


def splittable(path: Path) -> bool:
    """Whether ``path`` can be read in several parts: not when compressed (a stream has no byte to start at)."""
    return kind_of(path) == "parquet" or not path.name.lower().endswith((".gz", ".zst"))


@dataclass(frozen=True)
class Part:
    """One share of a file: bytes [start, end) of a plain JSONL or text file, row groups [start, end) of a Parquet
    file; end None: to the end."""

    start: int = 0
    end: int | None = None


def parts(path: Path, size: int) -> list[Part]:
    """``path`` cut into parts of about ``size`` bytes (of the file: for Parquet, whole row groups)."""
    if not splittable(path):
        return [Part()]
    if kind_of(path) == "parquet":
        meta = _parquet_file(path).metadata
        groups, out, start, taken = meta.num_row_groups, [], 0, 0
        for g in range(groups):
            taken += meta.row_group(g).total_byte_size
            if taken >= size and g + 1 < groups:
                out.append(Part(start, g + 1))
                start, taken = g + 1, 0
        return out + [Part(start, None)]
    total = path.stat().st_size
    return [Part(s, min(s + size, total) if s + size < total else None) for s in range(0, max(total, 1), size)]


class BadRowsError(DataError):
    """A source refused for its share of unreadable rows; ``report`` says how many and where."""

    def __init__(self, message: str, report: "RowReport"):
        super().__init__(message)
        self.report = report


@dataclass
class RowReport:
    """Rows read and rows skipped across a source's files, with the first few bad ones located."""

    rows: int = 0
    bad: int = 0
    first: list[str] = field(default_factory=list)

    def add_bad(self, where: str, why: str) -> None:
        self.rows += 1
        self.bad += 1
        if len(self.first) < FIRST_BAD_ROWS:
            self.first.append(f"{where}: {why}")

    def merge(self, other: "RowReport") -> None:
        """Add ``other``'s counts, and its first bad rows after this one's (the parts in file order)."""
        self.rows += other.rows
        self.bad += other.bad
        self.first += other.first[:FIRST_BAD_ROWS - len(self.first)]

    def check(self, source: str, max_bad_fraction: float) -> None:
        """Refuse the source when more than ``max_bad_fraction`` of its rows are bad (all of them, always)."""
        if self.bad and (self.bad == self.rows or self.bad > max_bad_fraction * self.rows):
            raise BadRowsError(f"{source}: {self.bad:,} of {self.rows:,} rows could not be read, more than "
                               f"dataset.max_bad_fraction={max_bad_fraction} allows; the first: "
                               f"{'; '.join(self.first)}. Fix those rows, or raise max_bad_fraction to skip them",
                               self)

    def to_dict(self) -> dict:
        return {"rows": self.rows, "bad": self.bad, "first": list(self.first)}

    @classmethod
    def from_dict(cls, data: dict) -> "RowReport":
        return cls(int(data["rows"]), int(data["bad"]), list(data["first"]))


def pieces(path: Path, label: str, text_field: str, report: RowReport,
           part: Part = Part()) -> Iterator[tuple[bool, str]]:
    """The text of one part of a text, JSONL or Parquet file as (starts a document, piece), in order; bad rows go
    to ``report``. ``label`` names the file in the report (its name inside the dataset)."""
    kind = kind_of(path)
    if kind == "text":
        yield from _text(path, part)
        return
    if kind == "jsonl":
        rows = _jsonl(path, label, text_field, report, part)
    elif kind == "parquet":
        rows = _parquet(path, label, text_field, report, part)
    else:
        raise DataError(f"{path} is a Megatron indexed dataset (token ids): it is read with its ids, not as text")
    for doc in rows:
        for k, piece in enumerate(split_text(doc) or [""]):
            yield k == 0, piece


def split_text(text: str) -> list[str]:
    """``text`` in pieces of about ``PIECE_CHARS`` characters, each ending at a line break where there is one."""
    out, start = [], 0
    while start < len(text):
        end = min(start + PIECE_CHARS, len(text))
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def _text(path: Path, part: Part) -> Iterator[tuple[bool, str]]:
    """A text file's part in pieces: from the first line that starts in it to the end of the line its last byte is
    in, so that consecutive parts cover the file once. The whole file is one document."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        position = _line_start(f, part.start)
        first = part.start == 0
        while part.end is None or position < part.end:
            block = f.read(PIECE_CHARS if part.end is None else min(PIECE_CHARS, part.end - position))
            if not block:
                break
            rest = b"" if block.endswith(b"\n") else f.readline()  # end the piece with the line it is in
            try:
                piece = decoder.decode(block + rest)
            except UnicodeDecodeError as exc:
                raise DataError(f"{path} is not UTF-8 text ({exc.reason} at byte {position + exc.start}): convert "
                                f"it or remove it from the dataset") from None
            position += len(block) + len(rest)
            yield first, piece
            first = False
        try:
            tail = decoder.decode(b"", final=True)  # a character cut off by the end of the file
        except UnicodeDecodeError as exc:
            raise DataError(f"{path} is not UTF-8 text ({exc.reason} at its end): convert it or remove it from the "
                            f"dataset") from None
        if tail or first:
            yield first, tail


def _line_start(f, start: int) -> int:
    """Seek ``f`` to the first line that starts at or after byte ``start``; that position."""
    if start == 0:
        return 0
    f.seek(start - 1)
    f.readline()  # the rest of the line byte start − 1 is in (just its newline when a line starts at ``start``)
    return f.tell()


def _open_lines(path: Path) -> io.BufferedIOBase:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard  # only for zstd files
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


class _LineNumbers:
    """Line numbers of a part that starts inside a file: counted from the file's start only when a bad row needs
    one, since most parts have none."""

    def __init__(self, path: Path, start: int):
        self.path, self.start, self.base = path, start, None

    def __call__(self, index_in_part: int) -> int:
        if self.base is None:
            self.base = 0
            if self.start:
                with open(self.path, "rb") as f:
                    left = self.start
                    while left > 0:
                        block = f.read(min(left, 1 << 24))
                        self.base += block.count(b"\n")
                        left -= len(block)
        return self.base + index_in_part


def _jsonl(path: Path, label: str, text_field: str, report: RowReport, part: Part) -> Iterator[str]:
    try:
        with _open_lines(path) as lines:
            position = _line_start(lines, part.start) if part.start else 0
            line_number = _LineNumbers(path, position)
            index = 0
            while part.end is None or position < part.end:
                raw = lines.readline()
                if not raw:
                    break
                position += len(raw)
                index += 1
                if not raw.strip():
                    continue  # blank lines are not rows

                def where() -> str:
                    return f"{label}:{line_number(index)}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    report.add_bad(where(), f"not UTF-8 ({exc.reason} at byte {exc.start})")
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    report.add_bad(where(), f"not JSON ({exc})")
                    continue
                if not isinstance(row, dict) or text_field not in row:
                    report.add_bad(where(), f"no field {text_field!r}")
                    continue
                text = row[text_field]
                if not isinstance(text, str):
                    report.add_bad(where(), f"field {text_field!r} holds {type(text).__name__}, not text")
                    continue
                report.rows += 1
                yield text
    except (OSError, EOFError) as exc:
        raise DataError(f"{path} cannot be read to the end ({exc}): is it a complete, uncorrupted file?") from None


def _parquet_file(path: Path):
    import pyarrow as pa  # only for Parquet files
    import pyarrow.parquet as pq
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path} is not a readable Parquet file ({exc})") from None


def _parquet(path: Path, label: str, text_field: str, report: RowReport, part: Part) -> Iterator[str]:
    import pyarrow as pa
    reader = _parquet_file(path)
    schema = reader.schema_arrow
    if text_field not in schema.names:
        raise DataError(f"{path} has no column {text_field!r}; its columns: {', '.join(schema.names)}. Set "
                        f"dataset.text_field to the one that holds the text")
    column_type = schema.field(text_field).type
    binary = pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type)
    if not (binary or pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise DataError(f"column {text_field!r} of {path} holds {column_type}, not text: set dataset.text_field to "
                        f"a string column")
    meta = reader.metadata
    end = meta.num_row_groups if part.end is None else part.end
    row = sum(meta.row_group(g).num_rows for g in range(part.start))  # rows before this part, for the report
    groups = list(range(part.start, end))
    if not groups:
        return
    for batch in reader.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field], row_groups=groups):
        for value in batch.column(0).to_pylist():
            row += 1
            where = f"{label}:row {row}"
            if value is None:
                report.add_bad(where, f"no value in {text_field!r}")
                continue
            if binary:  # bytes that should be text: each row decoded on its own
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError as exc:
                    report.add_bad(where, f"not UTF-8 ({exc.reason} at byte {exc.start})")
                    continue
            report.rows += 1
            yield value
