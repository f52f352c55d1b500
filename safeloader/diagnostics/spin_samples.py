"""Whether a worker's main thread, running, is caught in a library's retry loop: native samples of its stack.

How it works and why: docs/internals.md, ``safeloader.diagnostics.spin_samples``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from . import stacks

__all__ = ["SAMPLES", "loop_library", "sampler", "spinning_in"]

SAMPLES = 3
"""Native samples of the main thread, all of which must show the same loop."""
SAMPLE_PAUSE = 0.2
"""Seconds between two samples."""

Sample = Callable[[], "tuple[stacks.NativeFrames, list[str]] | None"]


def sampler(pid: int, native_path: str, native_signal: int, python_path: str, python_signal: int) -> Sample:
    """A function returning, for the main thread of ``pid`` now, its native frames and the files of its
    Python frames, both innermost first (the worker's C extension's dumper on ``native_signal``
    writing to ``native_path``; faulthandler on ``python_signal`` writing to ``python_path``), or None
    where either does not answer."""

    def sample() -> tuple[stacks.NativeFrames, list[str]] | None:
        from .. import native

        offset = stacks.size(native_path)
        try:
            native.signal_thread(pid, pid, native_signal)
        except OSError:
            return None
        deadline = time.monotonic() + stacks.NATIVE_THREAD_WAIT
        text = stacks.wait_for_dump(native_path, offset, deadline, marker=f"end-thread {pid}\n")
        frames = stacks.parse_native(text).get(pid)
        python_text, main_ident = stacks.python_stacks(pid, python_path, stacks.NATIVE_THREAD_WAIT, python_signal)
        main = next((t for t in stacks.parse_python(python_text, main_ident) if t.main), None)
        if not frames or main is None or not main.frames:
            return None
        return frames, [file for file, _, _ in main.frames]

    return sample


def _library_code(file: str) -> bool:
    """Whether ``file`` (a Python frame's) is the standard library's or an installed package's."""
    import sysconfig

    if file.startswith("<frozen "):
        return True
    roots = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(root and file.startswith(root + os.sep) for root in roots) or "-packages" + os.sep in file


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
    """The distribution whose code the main thread loops in at each of ``SAMPLES`` samples, never calling
    back the user's Python code from that distribution's own (np.vectorize does): the same
    object on every one, calling back into the interpreter on all but one at most (a sample can land
    in the call it retries), where that distribution also ships a library of ``live`` (objects with
    native threads in the parent); else None."""
    if sample is None or not live:
        return None
    stacks_seen, python_seen = [], []
    for attempt in range(SAMPLES):
        if attempt:
            time.sleep(SAMPLE_PAUSE)
        taken = sample()
        if taken is None:
            return None
        stacks_seen.append(taken[0])
        python_seen.append(taken[1])
    loops = [loop_library(frames) for frames in stacks_seen]
    found = next((library for library in loops if library is not None), None)
    if found is None or sum(library == found for library in loops) < SAMPLES - 1:
        return None
    if not all(any(library == found for library, _ in frames) for frames in stacks_seen):
        return None  # the loop returned meanwhile: another call, progressing
    owners = _distributions(found)
    for files in python_seen:
        if not _library_code(files[0]) and any(owners & _distributions(file) for file in files[1:]):
            return None  # the library calls the user's Python back (np.vectorize's function): progressing
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
