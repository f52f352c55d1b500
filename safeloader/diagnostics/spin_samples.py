"""Whether a worker's main thread, running, is caught in a library's retry loop: native samples of its
stack, and its Python frames read from outside.

How it works and why: docs/internals.md, ``safeloader.diagnostics.spin_samples``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import stacks

if TYPE_CHECKING:
    from importlib.metadata import Distribution

__all__ = ["LOOPS_NEEDED", "SAMPLES", "loop_library", "sampler", "spinning_in"]

SAMPLES = 13
"""Native samples of the main thread at most, one signal each."""
LOOPS_NEEDED = 6
"""Samples that must find the same library calling back into the interpreter: the sampling stops
at the sixth, and gives up once more than ``SAMPLES - LOOPS_NEEDED`` samples did not. pyzmq's retry
loop in a torch worker called back on 74% of 171 samples (the rest found it in libzmq): a worker is
named at its first sampling 99% of the time (the three samples, two needed, of the first version:
83%, and a miss cost 4 s). A slow item calling back on 30% of its samples is taken for a loop 17% of
the time, on 20% 3%, on 10% 0.1% (the first version: 22%, 10%, 3%); on 50% or more, the Python
frames must tell (``spinning_in``)."""
MISSES = 4
"""Samples that may go unanswered (the thread not run, or in a system call, each time it was looked
at; its dump late on a loaded machine) before the sampling gives up."""
SAMPLE_PAUSE = 0.01
"""Seconds between two samples (their Python reads, below, part them too)."""
RAN_BETWEEN = 1_000_000
"""Nanoseconds the thread must have run (on a CPU: ``/proc/<pid>/task/<pid>/schedstat``) since the
previous sample or read, before the next. On a loaded machine a worker waits for a CPU for tens of
milliseconds at a time, stopped where it was preempted, most often where it returned from a system
call: samples taken meanwhile all find it there (one sampling found pyzmq's loop returning from
libzmq's getpid() eight times out of nine so)."""
ON_CPU_LOOK = 0.001
"""Seconds between the two reads of the thread's run time that tell it is on a CPU now (it ran in
between): the signal is sent then, and interrupts it wherever it is, not where it was preempted."""
WAIT_TO_RUN = 0.3
"""Seconds a sample waits for all that, and for the thread to run out of any system call."""
LOOK_PAUSE = 0.005
"""Seconds between two looks at the thread, while a sample or a read waits."""
PYTHON_READS = 4
"""Reads of the thread's Python frames after each native sample (no signal: read from outside, about
a millisecond each), each once the thread ran again: a library that calls the user's Python back
(np.vectorize) is caught in the user's function by one of them at least, nearly always. Read right
after the native sample only, they would see the thread where the signal found it: np.vectorize was
then taken for a loop 7 times in 40."""
PYTHON_READ_TRIES = 8
"""Looks for those reads at most, ``LOOK_PAUSE`` apart."""

Sample = Callable[[], "tuple[stacks.NativeFrames, list[list[str]]] | None"]
"""A sample of the main thread: its native frames, and the files of its Python frames as each read
found them (reads that found none left out), both innermost first; None where it was not taken."""


def sampler(pid: int, native_path: str, native_signal: int, thread_state: int) -> Sample:
    """Samples of the main thread of ``pid``: its native frames from the worker's C extension's
    dumper (``native_signal``, writing to ``native_path``), sent only once the thread ran since the
    previous sample, while it is on a CPU out of any system call; its Python frames read from
    outside, at ``thread_state`` (``native.python_frames``: nothing runs in the worker for them)."""
    last = _cpu_time(pid)

    def ran(on_cpu: bool = False) -> bool:
        """Whether the thread ran ``RAN_BETWEEN`` since the last look that said so (then this one),
        and, with ``on_cpu``, whether it runs on a CPU now."""
        nonlocal last
        before = _cpu_time(pid) if on_cpu else None
        if before is not None:
            time.sleep(ON_CPU_LOOK)
        now = _cpu_time(pid)
        if before is not None and now is not None and now == before:
            return False  # waiting for a CPU
        if now is None or last is None or now - last >= RAN_BETWEEN:
            last = now
            return True
        return False

    def sample() -> tuple[stacks.NativeFrames, list[list[str]]] | None:
        from .. import native

        deadline = time.monotonic() + WAIT_TO_RUN
        while not (ran(on_cpu=True) and _in_user_code(pid)):
            if time.monotonic() >= deadline:
                return None
            time.sleep(LOOK_PAUSE)
        offset = stacks.size(native_path)
        try:
            native.signal_thread(pid, pid, native_signal)
        except OSError:
            return None
        deadline = time.monotonic() + stacks.NATIVE_THREAD_WAIT
        text = stacks.wait_for_dump(native_path, offset, deadline, marker=f"end-thread {pid}\n")
        frames = stacks.parse_native(text).get(pid)
        if not frames:
            return None
        reads: list[list[str]] = []
        for _ in range(PYTHON_READ_TRIES):
            if len(reads) == PYTHON_READS:
                break
            time.sleep(LOOK_PAUSE)
            if ran():
                python = native.python_frames(pid, thread_state)
                if python:
                    reads.append([file for file, _ in python])
        return frames, reads

    return sample


def _cpu_time(pid: int) -> int | None:
    """Nanoseconds the main thread of ``pid`` has run on a CPU, or None (no schedstat, or ended)."""
    from .. import native

    try:
        return int(native.read_proc(f"/proc/{pid}/task/{pid}/schedstat", 64).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _in_user_code(pid: int) -> bool:
    """Whether the main thread of ``pid`` runs out of any system call (or waits for a CPU there):
    the kernel says ``running`` in its ``/proc/<pid>/syscall``. A signal then interrupts no call (no
    EINTR, whatever the library's handler's restart flag), and the sample is of the loop, not of a
    wait."""
    from .. import native

    try:
        return native.read_proc(f"/proc/{pid}/syscall", 16).startswith("running")
    except OSError:
        return False


def _interpreter(path: str) -> bool:
    return os.path.basename(path).startswith(("libpython", "python"))


def _system(path: str) -> bool:
    return any(name in os.path.basename(path) for name in stacks.SYSTEM_LIBRARIES) or _interpreter(path)


def loop_library(frames: stacks.NativeFrames) -> str | None:
    """The library whose code, on this stack, calls back into the interpreter: the innermost object
    outside the C runtimes and the interpreter, with an interpreter frame inside it (innermost of it).
    None where the innermost such object calls nothing of the interpreter (native code computing).

    Only its innermost frame counts: numpy 2's functions are numpy's C dispatcher calling numpy's
    Python code calling numpy's C, so every sample of a long numpy call (a sort) would otherwise
    find numpy's outer frame calling back into the interpreter."""
    for index, (library, _) in enumerate(frames):
        if not _system(library):
            return library if any(_interpreter(inner) for inner, _ in frames[:index]) else None
    return None


def spinning_in(sample: Sample | None, live: frozenset[str]) -> str | None:
    """The distribution whose code the main thread loops in, never calling back the user's Python code
    from that distribution's own (np.vectorize does), where that distribution also ships a library of
    ``live`` (objects with native threads in the parent); else None.

    Samples are taken until ``LOOPS_NEEDED`` of them found the same object calling back into the
    interpreter (a call retried, its error raised and caught, in a loop), at most ``SAMPLES``; the
    object must lie on every sample's stack (else its call returned: another call, progressing),
    and no more than ``SAMPLES - LOOPS_NEEDED`` samples may find it computing instead (native code
    calling nothing of the interpreter, as a slow numpy or torch item does).
    """
    if sample is None or not live:
        return None
    stacks_seen: list[stacks.NativeFrames] = []
    python_seen: list[list[str]] = []
    found: str | None = None
    loops = misses = 0
    while loops < LOOPS_NEEDED:
        if stacks_seen or misses:
            time.sleep(SAMPLE_PAUSE)
        taken = sample()
        if taken is None:
            misses += 1
            if misses > MISSES:
                return None
            continue
        stacks_seen.append(taken[0])
        python_seen.extend(taken[1])
        library = loop_library(taken[0])
        if found is None:
            found = library
        loops += library is not None and library == found
        if len(stacks_seen) - loops > SAMPLES - LOOPS_NEEDED:
            return None  # computing more often than looping
        if found is not None and not all(any(path == found for path, _ in frames) for frames in stacks_seen):
            return None  # the loop returned meanwhile: another call, progressing
    if found is None or len(python_seen) < len(stacks_seen):
        return None  # too few Python stacks to tell the library's own loop from a callback of the user's
    shipped = _shared_distribution(found, live)
    if shipped is None:
        return None
    name, tops = shipped
    for files in python_seen:
        if not stacks.library_file(files[0]) and any(_site_entry(file) in tops for file in files[1:]):
            return None  # the library calls the user's Python back (np.vectorize's function): progressing
    return name


# -- which distribution ships an object --------------------------------------------------------
# Asked only of a confirmed loop, and only of the distributions of ``live`` objects: a wheel's
# bundled libraries name theirs (``pyzmq.libs`` -> pyzmq), a package directory is looked up by its
# own name, then in the distributions' top_level.txt, then in their RECORD. importlib.metadata's
# packages_distributions() reads every installed distribution's metadata (3 s in a large
# environment): that used to delay the report as long as the sampling itself.


def _site_entry(path: str) -> str | None:
    """The entry of site-packages (or dist-packages) that ``path`` lies in: its top-level package
    directory, or a wheel's ``<name>.libs``; None outside, or for a file right in site-packages."""
    parts = path.split(os.sep)
    for index, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages") and index + 2 < len(parts):
            return parts[index + 1]
    return None


def _site_of(path: str) -> str:
    parts = path.split(os.sep)
    for index, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return os.sep.join(parts[: index + 1])
    return ""


def _shared_distribution(found: str, live: frozenset[str]) -> tuple[str, frozenset[str]] | None:
    """(name, the site-packages entries it ships) of the distribution that ships both the object
    ``found`` and one of ``live``; None where none does. An object outside site-packages is matched by
    its file name alone (a system library live in the parent)."""
    entry = _site_entry(found)
    for path in sorted(live):
        other = _site_entry(path)
        if entry is None or other is None:
            if entry is None and other is None and os.path.basename(path) == os.path.basename(found):
                return _normal(os.path.basename(found)), frozenset()
            continue
        site = _site_of(path)
        if _site_of(found) != site:
            continue
        shipped = _distribution(site, other)
        if entry in shipped[1]:
            return shipped
    return None


_shipping: dict[tuple[str, str], tuple[str, frozenset[str]]] = {}


def _distribution(site: str, entry: str) -> tuple[str, frozenset[str]]:
    """(name, entries shipped) of the distribution installed in ``site`` that ships ``entry``; the
    entry itself, as a distribution of its own name, where none says so."""
    key = (site, entry)
    if key not in _shipping:
        named = entry
        for suffix in (".libs", ".dylibs"):
            if entry.endswith(suffix):
                named = entry.removesuffix(suffix)
        found = _shipped_by(site, named, entry)
        _shipping[key] = found if found is not None else (_normal(named), frozenset({entry}))
    return _shipping[key]


def _shipped_by(site: str, named: str, entry: str) -> tuple[str, frozenset[str]] | None:
    from importlib import metadata

    for distribution in metadata.distributions(name=named, path=[site]):
        entries = _entries(distribution)
        if entry in entries:
            return _normal(distribution.metadata["Name"] or named), entries
    try:
        infos = sorted(name for name in os.listdir(site) if name.endswith(".dist-info"))
    except OSError:
        return None
    for with_top_level in (True, False):  # top_level.txt is a few bytes; RECORD can be thousands of lines
        for info in infos:
            distribution = metadata.Distribution.at(os.path.join(site, info))
            top_level = distribution.read_text("top_level.txt")
            if with_top_level != (top_level is not None):
                continue
            if with_top_level and entry not in (top_level or "").split():
                continue
            entries = _entries(distribution)
            if entry in entries:
                return _normal(distribution.metadata["Name"] or info.split("-")[0]), entries
    return None


def _entries(distribution: Distribution) -> frozenset[str]:
    """The site-packages entries a distribution ships: the first part of each path of its RECORD,
    and its top_level.txt."""
    entries = set((distribution.read_text("top_level.txt") or "").split())
    for line in (distribution.read_text("RECORD") or "").splitlines():
        path = line.split(",", 1)[0].strip('"')
        first = path.split("/", 1)[0]
        if first and first != ".." and not first.endswith(".dist-info") and "/" in path:
            entries.add(first)
    return frozenset(entries)


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")
