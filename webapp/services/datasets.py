"""Datasets uploaded through the API: stored in the owner's upload folder, then registered like any other."""
import codecs
import re
from pathlib import Path

from django.conf import settings
from django.db import transaction

from ..models import Dataset, upload_folder

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_CHUNK = 1 << 20


class UploadTooLarge(ValueError):
    """The uploaded file is over WORKBENCH["MAX_UPLOAD_BYTES"]."""


class NotReadable(ValueError):
    """The uploaded file is not what its name says: not UTF-8 text, or not a Parquet, gzip or zstd file."""


# Files whose kind the trainer reads from the name (trainer.data.sources.kind_of) and that are not text: the bytes
# each starts with. Anything else must be UTF-8 text (plain text or JSONL). Megatron's .bin needs its .idx beside it,
# two files: such data is registered by its path under a data root.
BINARY_UPLOADS = {".parquet": b"PAR1", ".jsonl.gz": b"\x1f\x8b", ".jsonl.zst": b"\x28\xb5\x2f\xfd"}


def upload_limit() -> int:
    return settings.WORKBENCH["MAX_UPLOAD_BYTES"]


def safe_file_name(name: str) -> str:
    """A plain file name from a client's: its last part, ASCII letters, digits, '.', '_' and '-', not hidden (the
    trainer skips hidden files)."""
    plain = _UNSAFE.sub("_", Path(name.replace("\\", "/")).name).lstrip(".")[:100]
    return plain or "upload.txt"


def _free_path(folder: Path, name: str) -> Path:
    stem, suffix = Path(name).stem, Path(name).suffix
    candidate, n = folder / name, 1
    while candidate.exists():
        n += 1
        candidate = folder / f"{stem}-{n}{suffix}"
    return candidate


def _open_new(folder: Path, name: str):
    """A new file of about ``name`` in ``folder``, opened exclusively: two uploads of one name never share a file."""
    while True:
        target = _free_path(folder, safe_file_name(name))
        try:
            return target, open(target, "xb")
        except FileExistsError:
            continue


def _binary_kind(name: str) -> str | None:
    return next((suffix for suffix in BINARY_UPLOADS if name.lower().endswith(suffix)), None)


def _store(upload, folder: Path) -> Path:
    """Write ``upload`` to a new file in ``folder``; refuse it (and keep nothing) if it is too large, or is not the
    Parquet, gzip or zstd file its name says, or, named otherwise, not UTF-8 text."""
    folder.mkdir(parents=True, exist_ok=True)
    limit, written = upload_limit(), 0
    binary = _binary_kind(upload.name or "")
    decoder = None if binary else codecs.getincrementaldecoder("utf-8")()
    target, out = _open_new(folder, upload.name or "")
    try:
        with out:
            for chunk in upload.chunks(_CHUNK):
                if binary and written == 0 and not chunk.startswith(BINARY_UPLOADS[binary]):
                    raise NotReadable(f"the file is named {binary} but is not such a file (it does not begin with "
                                      f"{BINARY_UPLOADS[binary]!r}): send it under its own name")
                written += len(chunk)
                if written > limit:
                    raise UploadTooLarge(f"the file is over {limit:,} bytes (WORKBENCH_MAX_UPLOAD_MB): split it, or "
                                         f"ask staff for a data root that holds it")
                if decoder:
                    decoder.decode(chunk)
                out.write(chunk)
            if decoder:
                decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        target.unlink(missing_ok=True)
        raise NotReadable(f"the file is not UTF-8 text ({exc.reason}, {written:,} bytes in): send text or JSONL in "
                          f"UTF-8, or a file named {', '.join(BINARY_UPLOADS)}") from None
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


@transaction.atomic
def dataset_upload(*, owner, upload, **fields) -> Dataset:
    """Store the uploaded file (text, JSONL, compressed JSONL or Parquet) under the owner's upload folder and
    register it as their dataset.

    Raises UploadTooLarge, NotReadable or ValidationError (the dataset's fields); none of them leaves a file behind.
    """
    target = _store(upload, upload_folder(owner))
    try:
        dataset = Dataset(owner=owner, path=str(target), **fields)
        dataset.full_clean()
        dataset.save()
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return dataset
