"""Why a worker the watchdog is certain about never progresses: waiting idle, or spinning, inside a library
whose threads its parent runs and it does not have (why: docs/internals.md)."""

from __future__ import annotations

import os

__all__ = ["FIX", "headline", "lacking_threads", "overruled", "spinning"]

FIX = (
    "create or open what uses it in each worker, lazily (in __getitem__ or worker_init_fn), not in the "
    "parent; or pass on_unsafe_fork='forkserver' to the loader (workers started by a preloaded forkserver: "
    "the Dataset must pickle)"
)
"""What works whatever the library: the worker makes its own, or does not inherit the parent's."""
_BACKEND_ACTIVE = "was active: please report this stack as a safeloader bug"


def short_library(path: str) -> str:
    """``zmq/backend/cython/_zmq.so`` for an installed package's library, the file name otherwise."""
    _, marker, inside = path.rpartition("-packages" + os.sep)
    return inside if marker else os.path.basename(path)


def headline(worker_id: int, pid: int, waited: float, what: str, spinning: str) -> str:
    """The report's first line for a worker found certain never to progress."""
    start = f"DataLoader worker {worker_id} (pid {pid}) made no progress for {waited:.1f} s while {what}"
    start += ", and never will"
    if spinning:
        return (
            f"{start}: it keeps running, in a loop inside {spinning}'s native code, calling back into Python on "
            "each turn, and finishes no item; that library's threads were live in the parent at the fork and do "
            "not exist in the worker."
        )
    return (
        f"{start}: it waits, unchanged and idle, inside a library whose threads were live in the parent at the "
        "fork and do not exist in the worker."
    )


def _live_threads(library: str) -> int:
    from . import thread_owners

    real = os.path.realpath(library)
    return sum(n for lib, n in thread_owners.live_libraries().items() if os.path.realpath(lib) == real)


def lacking_threads(library: str) -> str | None:
    """Any library: the worker waits in one whose threads this process (its parent) runs."""
    from . import native_libraries

    count = _live_threads(library)
    if not count:
        return None
    package = native_libraries.package_of(library)
    where = short_library(library) + (f" ({package})" if package != os.path.basename(library) else "")
    return (
        f"{package}'s native threads, inherited without them: the worker waits in {where}, whose {count} "
        "thread(s) run in the parent and did not survive the fork; a forked "
        f"child has the pool's bookkeeping but none of its threads, so the job it queued never runs. Fix: {FIX}."
    )


def overruled(cause: str) -> str:
    """A certain report whose library the table says a backend handles, with that backend active: the
    table's words stay, its remedy (report a bug) is replaced by one that works."""
    if _BACKEND_ACTIVE not in cause:
        return cause
    head = cause.split(" Fix: ", 1)[0]
    return (
        f"{head} Its backend was active, and the worker still waits for threads it does not have (the library "
        f"undid what the backend set, e.g. its own thread count on every call). Fix: {FIX}."
    )


def spinning(package: str, frames: list[tuple[str, str]]) -> str:
    """A worker spinning in ``package``'s code (``frames``: its main thread's, innermost first)."""
    from . import spin_samples

    loop = spin_samples.loop_library(frames) if frames else None
    where = f" ({short_library(loop)})" if loop else ""
    return (
        f"{package}'s native state, inherited without its threads: the worker's main thread retries a call into "
        f"{package}{where} for ever, at full CPU (a context or socket made in the parent, whose I/O threads a "
        "forked child does not have, fails every call there, e.g. pyzmq's with EINTR, which pyzmq retries). "
        f"Fix: {FIX.replace('uses it', f'uses {package}')}."
    )
