"""What changes with every import: caches of facts about the imported modules are keyed on it."""

from __future__ import annotations

import sys


def modules_state() -> tuple[int, str, object]:
    """A value that changes with every import: a new name (or a name deleted and imported
    again) enters ``sys.modules`` last, a dict that keeps insertion order."""
    last = next(reversed(sys.modules))
    return len(sys.modules), last, sys.modules.get(last)
