"""The fork-time check's findings and words: ``Hazard``, ``UnsafeForkWarning``, and the error that explains
a worker such a library killed; the check itself is ``safeloader._fork_check`` (why: docs/internals.md)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsafeForkWarning

__all__ = ["Hazard", "UnsafeForkWarning", "dead_worker_error", "remedies"]


@dataclass(frozen=True)
class Hazard:
    """A library whose live threads a forked worker would not have."""

    library: str  # the shared object's path
    package: str  # the Python package that ships it, or the file name
    threads: int
    what: str  # "duckdb's native threads", "polars' rayon pool and tokio runtime"
    note: str = ""  # what the table knows: how it fails, its own fork-safe setting
    aborts: bool = False  # the library itself terminates a forked child that uses it
    # What it does in a forked worker is known (a table entry; a rayon, tokio or OpenMP runtime).
    # Unknown: a C/C++ pool of its own, which may cope with fork (onnxruntime's intra-op pool
    # does: the caller runs what no thread took) or not (its inter-op pool waits forever).
    known: bool = True

    def __str__(self) -> str:
        return f"{self.what} ({self.threads} live thread{'s' if self.threads != 1 else ''})"


# Backends whose libraries cope without them (OpenBLAS and torch reset their pools at fork;
# GNU OpenMP is checked below).


def dead_worker_error(error: BaseException, found: tuple[Hazard, ...]) -> RuntimeError | None:
    """torch's "DataLoader worker ... exited unexpectedly / is killed by signal", saying which library
    the parent held at the fork (``found``) and what to do; None for another error or where it held none."""
    if not found or not isinstance(error, RuntimeError) or not str(error).startswith("DataLoader worker"):
        return None
    held = "; ".join(str(hazard) for hazard in found)
    return RuntimeError(
        f"{error} safeloader: this loader forked its workers from a process holding {held} (on_unsafe_fork='warn' "
        f"or 'ignore'), which a forked worker inherits without its threads: a library can terminate such a worker "
        f"itself (its message is on stderr above).{remedies(list(found))}"
    )


def _checked_yourself(found: list[Hazard]) -> str:
    unknown = [h.package for h in found if not h.known]
    return f" or you checked that {' and '.join(unknown)} works in forked workers" if unknown else ""


def remedies(found: list[Hazard]) -> str:
    notes = "".join(f" {h.package}: {h.note}." for h in found if h.note)
    return (
        f"{notes} To keep forked workers: create or open what uses it in each worker, lazily (in "
        "__getitem__ or worker_init_fn), not in the parent; or pass on_unsafe_fork='ignore' if the "
        f"workers never use it{_checked_yourself(found)}. Or pass on_unsafe_fork='forkserver' to start the "
        "workers with a preloaded forkserver (the Dataset must pickle, the main script needs an "
        "`if __name__ == \"__main__\":` guard)."
    )
