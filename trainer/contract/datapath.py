"""Which files a dataset path stands for, and whether they may be read. Standard library only.

The web app checks a dataset when it is registered, when a run is made of it and when the run launches; the
trainer checks it again just before it reads. All of them ask ``data_files``, so the rules are the same everywhere:

- The path is resolved (``..`` and symbolic links followed) before anything else is decided.
- With ``roots``: the resolved path must lie inside a root and must not be a root itself (a whole root holds other
  users' data). Of the roots and the ``excluded`` folders, the nearest one above a path decides: a user's own folder
  inside another user's excluded tree is theirs, another user's folder inside a shared root is not.
  A path that does not exist is refused with the same message as one outside the roots, so that the answer never
  tells which files exist where the asker may not look.
- A file must be a regular file: FIFOs, sockets and devices are refused (reading one blocks, or never ends).
- A folder stands for the regular files under it, found recursively in sorted order of their relative paths;
  hidden files and folders (a name starting with ".") are not data and are skipped. A symbolic link inside the
  folder may point only inside the folder (so a folder that passes here passes the trainer's check too); links to
  folders are not followed. With ``roots``, every sub-folder must be allowed as well: a folder that holds an
  excluded one is refused, not silently thinned.

Without ``roots`` only the kind and link rules apply: what the trainer checks just before it reads, the roots having
been checked by whoever wrote the spec.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["DataPathError", "data_files"]

PathLike = str | os.PathLike


class DataPathError(ValueError):
    """A dataset path that may not be read; the message says why and what to do instead."""


def _kind(mode: int) -> str | None:
    """What a non-regular, non-folder file is, or None for a regular file or a folder."""
    for test, name in ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return None


class _Area:
    """The folders a path may resolve into: inside a root, unless a nearer excluded folder says otherwise."""

    def __init__(self, roots: Iterable[PathLike], excluded: Iterable[PathLike]):
        self.roots = [Path(os.path.realpath(r)) for r in roots]
        self.excluded = [Path(os.path.realpath(e)) for e in excluded]

    def allows(self, resolved: Path) -> bool:
        def nearest(folders: list[Path]) -> int:
            return max((len(f.parts) for f in folders if resolved.is_relative_to(f)), default=-1)
        inside = nearest(self.roots)
        return inside >= 0 and inside > nearest(self.excluded)  # a folder both given and excluded is excluded

    def is_root(self, resolved: Path) -> bool:
        return resolved in self.roots


def _not_allowed(path: PathLike, roots: Sequence[PathLike]) -> DataPathError:
    where = ", ".join(str(r) for r in roots) or "(none)"
    return DataPathError(f"{path} is not a file or folder you may use: a dataset is a regular file, or a folder of "
                         f"them, that exists under one of your data roots ({where}); upload the file, or ask staff "
                         f"for a data root that holds it")


def data_files(path: PathLike, roots: Sequence[PathLike] | None = None, *,
               excluded: Sequence[PathLike] = ()) -> list[Path]:
    """The regular files ``path`` stands for (itself, or those under the folder), or DataPathError.

    The files are returned as found under ``path`` (not resolved), in sorted order of their paths relative to it,
    so that names derived from them stay the same wherever the check runs.
    """
    given = Path(path)
    if roots is not None and not given.is_absolute():
        raise DataPathError(f"{path} is a relative path: give the absolute path of the file or folder (a relative "
                            f"path would mean another place to the web server, the workers and the trainer)")
    resolved = Path(os.path.realpath(given))
    area = _Area(roots, excluded) if roots is not None else None
    if area is not None:
        if area.is_root(resolved):
            raise DataPathError(f"{path} is a data root itself, which holds other datasets and users' files: "
                                f"register a file or a folder inside it")
        if not area.allows(resolved):
            raise _not_allowed(path, roots)
    try:
        mode = os.stat(resolved).st_mode
    except OSError:
        if area is not None:
            raise _not_allowed(path, roots) from None
        raise DataPathError(f"{path} cannot be read: give an existing text file or folder of them") from None
    kind = _kind(mode)
    if kind:
        raise DataPathError(f"{path} is a {kind}, not a regular file: a dataset is a regular text file or a folder "
                            f"of them")
    if stat.S_ISREG(mode):
        return [given]
    files = [given / rel for rel in _walk(resolved, given, area or _Area([resolved], []))]
    return sorted(files, key=lambda f: f.relative_to(given).as_posix())


def _walk(folder: Path, shown: Path, area: _Area) -> list[Path]:
    """Relative paths of the regular files under ``folder``: hidden entries skipped, links to folders not followed,
    every link's target inside the folder, every sub-folder inside ``area``."""
    found: list[Path] = []
    for top, dirs, names in os.walk(folder, followlinks=False):
        top = Path(top)
        for name in [n for n in (*dirs, *names) if not n.startswith(".") and (top / n).is_symlink()]:
            target = Path(os.path.realpath(top / name))
            if not (target.is_relative_to(folder) and area.allows(target)):
                raise DataPathError(f"{shown / (top / name).relative_to(folder)} is a symbolic link to a place "
                                    f"outside the dataset folder: copy the data into the folder instead of linking "
                                    f"to it")
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (top / d).is_symlink()]
        for d in dirs:
            if not area.allows(top / d):  # another user's folder inside this one
                raise DataPathError(f"{shown / (top / d).relative_to(folder)} is a folder you may not use: register "
                                    f"a folder that holds only data of yours")
        for name in names:
            if name.startswith("."):
                continue
            entry = top / name
            try:
                mode = os.stat(entry).st_mode  # follows a link, whose target was checked above
            except OSError:
                continue  # a dangling link, or a file removed meanwhile: nothing to read
            kind = _kind(mode)
            if kind:
                raise DataPathError(f"{shown / entry.relative_to(folder)} is a {kind}, not a regular file: remove "
                                    f"it from the dataset folder")
            if stat.S_ISREG(mode):
                found.append(entry.relative_to(folder))
    return found
