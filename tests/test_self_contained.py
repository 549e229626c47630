"""The repository stands on its own: no tracked file points outside it, and every document and source file it cites
exists.

A clone has nothing beside the repository, so a reference to a folder next to the checkout (the working material
some checkouts have beside them, and what lies in it) is a dead end for its reader, and so is a cited
``something.md`` that is not in the repository, or a comment pointing at ``trainer/old_module.py`` after the code
moved.
Standard library only: no Django needed.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THIS_FILE = Path(__file__).resolve()

# References to material outside the repository: the folder's name is spelled in two pieces, so that this file,
# which must name it, does not refer to it itself.
SIBLING = "sha" + "red"
OUTSIDE = re.compile(rf"\.\./{SIBLING}\b|(?<![\w-]){SIBLING}/(?:data|DESIGN|RECIPES|REFERENCE)\b")
# A cited Markdown document: a bare name (README.md) or a path (docs/x.md, ../x.md); not a glob such as *.md.
MARKDOWN = re.compile(r"[\w./-]*[\w-]\.md\b")
# A cited file of the project's own folders: trainer/engine/loop.py, tests/trainer/conftest.py (globs are not citations).
SOURCE = re.compile(r"(?<![\w./-])(?:trainer|webapp|workers|deploy|bench|tests|scripts|docs)/"
                    r"[\w./-]*\.(?:py|sh|json|toml|txt)\b")
URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+|\bwww\.\S+")


def tracked_files(root: Path) -> list[str]:
    """The files git tracks under ``root``, as paths relative to it."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return [name for name in out.decode("utf-8", "surrogateescape").split("\0") if name]


def _text(path: Path) -> str | None:
    """The file's text, or None for binary (a NUL byte, or not UTF-8) and missing files."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _in_repository(token: str, citing: str, files: set[str]) -> bool:
    """Whether ``token`` names one of ``files``: as a path from the root, or from the citing file's folder."""
    folder = os.path.dirname(citing)
    for candidate in (token, os.path.join(folder, token)):
        if candidate.startswith("/"):
            continue
        normal = os.path.normpath(candidate).replace(os.sep, "/")
        if not normal.startswith("../") and normal in files:
            return True
    return False


def problems(root: Path, files: list[str]) -> list[str]:
    """``path:line: what`` for every outside reference and every cited Markdown document missing from ``files``.

    ``files`` are paths relative to ``root`` (what the repository holds); binary files and this test module (which
    has to spell the patterns) are skipped.
    """
    root = Path(root).resolve()
    present = {os.path.normpath(f).replace(os.sep, "/") for f in files}
    found: list[str] = []
    for name in files:
        path = (root / name).resolve()
        if path == THIS_FILE:
            continue
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for match in OUTSIDE.finditer(line):
                found.append(f"{name}:{number}: refers to {match.group(0)!r}, outside the repository")
            plain = URL.sub(" ", line)
            cited = dict.fromkeys(m.group(0) for pattern in (MARKDOWN, SOURCE) for m in pattern.finditer(plain))
            for token in cited:  # each document once a line (a Markdown link often names it twice)
                if not _in_repository(token, name, present):
                    found.append(f"{name}:{number}: cites {token!r}, which is not in the repository")
    return found


def test_it_finds_no_outside_references_or_missing_documents_in_the_repository():
    found = problems(REPO, tracked_files(REPO))
    assert not found, "\n".join(["tracked files point outside the repository or at missing documents:", *found])


def test_it_reports_outside_references_and_missing_documents_and_files(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n")
    (tmp_path / "data.py").write_text(
        f'"""Reads text."""\nPATH = "../{SIBLING}/data/x.txt"\n# from {SIBLING}/RECIPES\n')
    (tmp_path / "notes.md").write_text("# Notes\n\nSee MISSING.md for the rest.\n")
    (tmp_path / "elsewhere.md").write_text("A bare name is looked for at the root and beside me: guide.md\n")
    (tmp_path / "fine.md").write_text(
        "See docs/guide.md, [the guide](docs/guide.md#top) and notes.md.\n"
        "A link is not a citation: https://example.org/README.md. Nor is a glob: *.md\n")
    (tmp_path / "docs" / "index.md").write_text("The guide: guide.md; the notes: ../notes.md.\n")
    (tmp_path / "blob.bin").write_bytes(f"\0\x01../{SIBLING}/data MISSING.md".encode())
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "loop.py").write_text('"""Moved from trainer/train.py; see trainer/loop.py, trainer/*.py."""\n')
    files = ["docs/guide.md", "docs/index.md", "data.py", "notes.md", "elsewhere.md", "fine.md", "blob.bin",
             "trainer/loop.py"]

    found = problems(tmp_path, files)

    assert found == [
        f"data.py:2: refers to '../{SIBLING}', outside the repository",
        f"data.py:3: refers to '{SIBLING}/RECIPES', outside the repository",
        "notes.md:3: cites 'MISSING.md', which is not in the repository",
        "elsewhere.md:1: cites 'guide.md', which is not in the repository",
        "trainer/loop.py:1: cites 'trainer/train.py', which is not in the repository",
    ]


def test_it_accepts_documents_that_exist_and_skips_itself(tmp_path):
    (tmp_path / "README.md").write_text("# Read me\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text('"""See README.md and pkg/NOTES.md."""\n')
    (tmp_path / "pkg" / "NOTES.md").write_text("Back to ../README.md, or NOTES.md beside me.\n")

    assert problems(tmp_path, ["README.md", "pkg/mod.py", "pkg/NOTES.md"]) == []
    # this module spells the patterns it looks for, and is left out of its own check
    assert problems(REPO, [str(THIS_FILE.relative_to(REPO))]) == []
