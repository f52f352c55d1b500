"""Which library owns a native thread pool, and what kind of pool it is: for diagnostics
(why: docs/internals.md)."""

from __future__ import annotations

import mmap
import os
import sys

from .._imports import modules_state

__all__ = ["RUNTIME_MARKERS", "describe", "extension_modules", "owner", "runtimes"]

# Crate names as they appear in a Rust binary's panic locations and type names.
RUNTIME_MARKERS: dict[str, tuple[bytes, ...]] = {
    "rayon pool": (b"rayon-core-", b"rayon_core::"),
    "tokio runtime": (b"tokio-1.", b"tokio::runtime"),
}
# Symbol fragments of the same runtimes, for libraries that kept their symbols.
RUNTIME_SYMBOLS: dict[str, tuple[str, ...]] = {
    "rayon pool": ("rayon_core", "rayon::"),
    "tokio runtime": ("tokio::", "tokio_"),
}

# Module state below: caches of what this process loaded and imported.
_runtimes: dict[str, tuple[str, ...]] = {}
# File name of each extension module's shared object -> (its path as imported, module name),
# for the sys.modules it was built from: rebuilt only after an import, with no file system
# access; only the few paths sharing a library's file name are resolved (``realpath``).
_extension_modules: tuple[tuple[int, str, object], dict[str, list[tuple[str, str]]]] | None = None
_indexed: tuple[int, str] = (0, "")  # how many modules the index has read, and the last one's name
_realpaths: dict[str, str] = {}


def _realpath(path: str) -> str:
    real = _realpaths.get(path)
    if real is None:
        real = _realpaths[path] = os.path.realpath(path)
    return real


def runtimes(path: str) -> tuple[str, ...]:
    """The runtimes with their own thread pools linked into the shared object ``path`` ("rayon pool", ...)."""
    real = _realpath(path)
    found = _runtimes.get(real)
    if found is None:
        kinds = []
        try:
            with open(real, "rb") as library, mmap.mmap(library.fileno(), 0, prot=mmap.PROT_READ) as data:
                for kind, markers in RUNTIME_MARKERS.items():
                    if any(data.find(marker) >= 0 for marker in markers):
                        kinds.append(kind)
        except (OSError, ValueError):  # unreadable, or empty
            pass
        found = _runtimes[real] = tuple(kinds)
    return found


def runtimes_in_symbols(symbols: list[str]) -> tuple[str, ...]:
    return tuple(kind for kind, parts in RUNTIME_SYMBOLS.items() if any(p in s for s in symbols for p in parts))


def _modules_by_file_name() -> dict[str, list[tuple[str, str]]]:
    """Brought up to date after imports by reading only the modules added since (``sys.modules``
    keeps insertion order); read whole again when one was removed."""
    global _extension_modules, _indexed
    state = modules_state()
    if _extension_modules is not None and _extension_modules[0] == state:
        return _extension_modules[1]
    items = list(sys.modules.items())
    count, last = _indexed
    if _extension_modules is not None and 0 < count <= len(items) and items[count - 1][0] == last:
        by_name, new = _extension_modules[1], items[count:]
    else:
        by_name, new = {}, items
    for name, module in new:
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.endswith(".so"):
            by_name.setdefault(os.path.basename(file), []).append((file, name))
    _extension_modules = (state, by_name)
    _indexed = (len(items), items[-1][0] if items else "")
    return by_name


def extension_modules(path: str) -> list[str]:
    """Names of the imported extension modules loaded from the shared object ``path``."""
    candidates = _modules_by_file_name().get(os.path.basename(path), [])
    if not candidates:
        return []
    real = _realpath(path)
    return [name for file, name in candidates if file == path or _realpath(file) == real]


def owner(path: str) -> str:
    """The name of the Python package that ships ``path`` ("polars"), or the library's file name."""
    return package_of(path)


def package_of(path: str) -> str:
    """The Python package that ships the shared object ``path`` ("polars", "av"), or its file name, from the
    extension modules loaded from it or its place under site-packages; nothing is read from disk."""
    names = extension_modules(path)
    public = [name for name in names if not name.split(".")[0].startswith("_")]
    if public or names:
        top = (public or names)[0].split(".")[0]
        return top.lstrip("_") or top  # "_duckdb": the duckdb package's extension
    return package_by_place(path)


def package_by_place(path: str) -> str:
    parts = path.split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages") and i + 2 < len(parts):
            top = parts[i + 1]
            for suffix in (".libs", ".dylibs"):
                top = top.removesuffix(suffix)
            return top.lstrip("_") or top
    return os.path.basename(path)


def describe(path: str, kinds: tuple[str, ...]) -> str:
    """ "polars' rayon pool and tokio runtime" """
    name = owner(path)
    possessive = "'" if name.endswith("s") else "'s"
    return f"{name}{possessive} {' and '.join(kinds) or 'native threads'}"
