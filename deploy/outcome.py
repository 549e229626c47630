"""How the deploy commands end, for a person at a terminal and for the worker that runs them as processes.

Done: one JSON report line on stdout, status 0. Refused (the input cannot be served, converted or read; the message
says what to change): one ``error:`` line on stderr, status 2. Any other failure (a torn file, a full disk): one
``error:`` line naming the exception, status 1, never a traceback in the worker's log.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

REFUSED, FAILED = 2, 1


def report_outcome(what: str, work: Callable[[], Any], refusals: tuple[type[BaseException], ...]) -> int:
    """Run ``work`` (which returns the JSON-able report) and end as above; ``what`` names it in a failure."""
    try:
        report = work()
    except refusals as exc:
        print(f"error: {exc}", file=sys.stderr)
        return REFUSED
    except Exception as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        print(f"error: {what} failed: {type(exc).__name__}: {first_line}", file=sys.stderr)
        return FAILED
    print(json.dumps(report), flush=True)
    return 0
