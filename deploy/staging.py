"""An entry built out of sight and swapped into place, so a reader (a server scanning its model repository) sees the
former entry or the new one, never half of one.

    with staged(repository / name) as folder:
        ...write every file under folder...
    # here repository/name is the new entry; after an exception the former one is untouched

The folder is made beside the repository (not inside it) on the same file system, so the swap is a rename.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def staged(target: Path) -> Iterator[Path]:
    """An empty folder to build ``target`` in; put at ``target`` when the block ends without an exception, removed
    in any case."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes it private; the server may run as another user
        replace_folder(target, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_folder(target: Path, staging: Path) -> None:
    """Put ``staging`` at ``target``; an entry already there is moved aside first and removed after."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}-old-{time.time_ns()}")
        target.rename(old)
    staging.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
