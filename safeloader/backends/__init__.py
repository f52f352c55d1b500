"""Built-in backends: one module per native library, each registering its fork hooks.

A backend module imports nothing of its library at import time: its hooks
declare ``requires=(...)`` and run only when the program imported the library.
"""

from __future__ import annotations

import importlib

# Modules under safeloader.backends, registered in this order at import of safeloader.
BUILTIN: tuple[str, ...] = ()


def register_builtin() -> None:
    for name in BUILTIN:
        importlib.import_module(f"{__name__}.{name}").register()
