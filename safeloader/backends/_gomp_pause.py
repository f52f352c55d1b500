"""GNU OpenMP's thread pool released in the parent right before a worker fork, so the worker has none
(why: docs/internals.md)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["NO_PAUSE", "IN_REGION", "release"]

_OMP_PAUSE_HARD = 2  # omp_pause_resource_t; libgomp treats soft and hard alike (it ignores the kind)

NO_PAUSE = "this libgomp has no omp_pause_resource_all (it is older than GCC 9)"
IN_REGION = "the forking thread is inside an OpenMP parallel region, whose team cannot be released"

# Real path of each libgomp copy looked at -> its omp_pause_resource_all, or None (no such symbol).
# Looked up once per copy and process, in the parent; a ctypes function object stays valid after fork.
_pause_of: dict[str, Any] = {}


def _pause_function(path: str, libraries: tuple[str, ...]) -> Any:
    if path not in _pause_of:
        import ctypes  # here: importing safeloader imports no ctypes

        # The name the dynamic loader knows the copy by (a link's, such as /lib/.../libgomp.so.1), so
        # that dlopen matches it by name instead of opening the file to compare it with each object.
        name = next((loaded for loaded in libraries if "libgomp" in loaded and os.path.realpath(loaded) == path), path)
        try:  # the copy already loaded (RTLD_NOLOAD: never a new load)
            dynlib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        except OSError:
            dynlib = None
        pause = getattr(dynlib, "omp_pause_resource_all", None)
        if pause is not None:
            pause.argtypes = (ctypes.c_int,)
            pause.restype = ctypes.c_int
        _pause_of[path] = pause
    return _pause_of[path]


def release(paths: tuple[str, ...], libraries: tuple[str, ...] = ()) -> dict[str, str]:
    """Release the calling thread's pool in each libgomp copy at ``paths`` (``libraries``: the loaded
    objects, as ``forkstate`` lists them), on the forking thread just before the fork; returns the
    copies whose pool could not be released, each with why."""
    refused: dict[str, str] = {}
    for path in paths:
        pause = _pause_function(path, libraries)
        if pause is None:
            refused[path] = NO_PAUSE
        elif pause(_OMP_PAUSE_HARD) != 0:
            refused[path] = IN_REGION
    return refused
