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


class NotText(ValueError):
    """The uploaded file is not UTF-8 text."""


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


def _store(upload, folder: Path) -> Path:
    """Write ``upload`` to a new file in ``folder``; refuse it (and keep nothing) if it is too large or not UTF-8."""
    folder.mkdir(parents=True, exist_ok=True)
    limit, written = upload_limit(), 0
    decoder = codecs.getincrementaldecoder("utf-8")()
    target, out = _open_new(folder, upload.name or "")
    try:
        with out:
            for chunk in upload.chunks(_CHUNK):
                written += len(chunk)
                if written > limit:
                    raise UploadTooLarge(f"the file is over {limit:,} bytes (WORKBENCH_MAX_UPLOAD_MB): split it, or "
                                         f"ask staff for a data root that holds it")
                decoder.decode(chunk)
                out.write(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        target.unlink(missing_ok=True)
        raise NotText(f"the file is not UTF-8 text ({exc.reason}, {written:,} bytes in): datasets are text; "
                      f"convert it to UTF-8 first") from None
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


@transaction.atomic
def dataset_upload(*, owner, upload, **fields) -> Dataset:
    """Store the uploaded text file under the owner's upload folder and register it as their dataset.

    Raises UploadTooLarge, NotText or ValidationError (the dataset's fields); none of them leaves a file behind.
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
