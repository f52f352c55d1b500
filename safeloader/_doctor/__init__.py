"""``safeloader doctor``: what would happen if this process started DataLoader workers now
(why: docs/internals.md)."""
from __future__ import annotations

import json as json_module
import sys
from collections.abc import Iterable
from typing import IO, Any

from .collect import collect
from .text import format_report

__all__ = ["collect", "doctor", "format_report"]


def doctor(*, imports: Iterable[str] = (), json: bool = False, file: IO[str] | None = sys.stdout) -> dict[str, Any]:
    """Print what safeloader sees in this process and what it will do; return the same as a dict.
    ``imports``: modules to import first. ``json=True`` prints JSON. ``file=None`` prints nothing."""
    report = collect(imports)
    if file is not None:
        text = json_module.dumps(report, indent=2) if json else format_report(report)
        try:
            print(text, file=file)
        except BrokenPipeError:  # piped into head & co.
            pass
    return report
