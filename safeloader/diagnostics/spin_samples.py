"""Whether a worker's main thread, running, is caught in a library's retry loop: native samples of its stack.

How it works and why: docs/internals.md, ``safeloader.diagnostics.spin_samples``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from . import stacks

__all__ = ["SAMPLES", "native_sampler", "spinning_in"]

SAMPLES = 3
"""Native samples of the main thread, all of which must show the same loop."""
SAMPLE_PAUSE = 0.2
"""Seconds between two samples."""

Sample = Callable[[], "stacks.NativeFrames | None"]


def native_sampler(pid: int, path: str, signum: int) -> Sample:
    """A function returning the main thread of ``pid``'s native frames now (its C extension's dumper on
    ``signum``, writing to ``path``), innermost first, or None where it does not answer."""

    def sample() -> stacks.NativeFrames | None:
        offset = stacks.size(path)
        from .. import native

        try:
            native.signal_thread(pid, pid, signum)
        except OSError:
            return None
        deadline = time.monotonic() + stacks.NATIVE_THREAD_WAIT
        text = stacks.wait_for_dump(path, offset, deadline, marker=f"end-thread {pid}\n")
        return stacks.parse_native(text).get(pid)

    return sample


def _interpreter(path: str) -> bool:
    return os.path.basename(path).startswith(("libpython", "python"))


def _system(path: str) -> bool:
    return any(name in os.path.basename(path) for name in stacks.SYSTEM_LIBRARIES) or _interpreter(path)


def loop_library(frames: stacks.NativeFrames) -> str | None:
    """The library whose code, on this stack, calls back into the interpreter: the innermost object
    outside the C runtimes and the interpreter, with an interpreter frame inside it (innermost of it).
    None where the innermost such object calls nothing of the interpreter (native code computing)."""
    for index, (library, _) in enumerate(frames):
        if not _system(library):
            return library if any(_interpreter(inner) for inner, _ in frames[:index]) else None
    return None


def spinning_in(sample: Sample | None, live: frozenset[str]) -> str | None:
    """The distribution whose code every one of ``SAMPLES`` samples finds the main thread looping in
    (``loop_library``: the same object each time), where that distribution also ships a library of
    ``live`` (objects with native threads in the parent); else None."""
    if sample is None or not live:
        return None
    found = None
    for attempt in range(SAMPLES):
        if attempt:
            time.sleep(SAMPLE_PAUSE)
        frames = sample()
        library = loop_library(frames) if frames else None
        if library is None or (found is not None and library != found):
            return None
        found = library
    assert found is not None
    owners = _distributions(found)
    for path in live:
        shared = owners & _distributions(path)
        if shared:
            return sorted(shared)[0]
    return None


def _distributions(path: str) -> set[str]:
    """The installed distributions that ship the object ``path``, by its place under site-packages:
    its top-level package's (``zmq`` -> pyzmq) or, for a wheel's bundled libraries (``pyzmq.libs``),
    the name before ``.libs``."""
    parts = path.split(os.sep)
    for index, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages") and index + 2 < len(parts):
            top = parts[index + 1]
            for suffix in (".libs", ".dylibs"):
                if top.endswith(suffix):
                    return {_normal(top.removesuffix(suffix))}
            return {_normal(name) for name in _packages().get(top, [top])}
    return {_normal(os.path.basename(path))}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


_package_map: dict[str, list[str]] | None = None


def _packages() -> dict[str, list[str]]:
    """importlib.metadata's top-level package -> distributions, read once (a confirmed spin only)."""
    global _package_map
    if _package_map is None:
        from importlib import metadata

        _package_map = dict(metadata.packages_distributions())
    return _package_map
