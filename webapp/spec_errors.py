"""A contract error as field errors, for every layer of the web app.

``SpecError.errors`` maps dotted field paths ('' for the whole object) to messages. Layers differ only in where a
path lands (the REST API gives each path its own key, a model's JSON field takes every path of its spec, a run
takes the part of its spec a path starts with), so that is a parameter; when several paths share one field, the
messages keep their path so that the reader still knows which number to change.
"""
from typing import Callable

from trainer.contract import SpecError


def spec_field_errors(exc: SpecError, field_of: Callable[[str], str], *,
                      with_path: bool = False) -> dict[str, list[str]]:
    """``{field_of(path): messages}``; with ``with_path`` each message reads "path: message"."""
    errors: dict[str, list[str]] = {}
    for path, messages in exc.errors.items():
        errors.setdefault(field_of(path), []).extend(f"{path}: {m}" if with_path and path else m for m in messages)
    return errors
