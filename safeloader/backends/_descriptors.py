"""This process's descriptor table, listed once per worker fork for the hooks that read it.

How it works and why: docs/internals.md, ``safeloader.backends._descriptors``.
"""

from __future__ import annotations

import os
import threading

from .. import native

PROC_FD = "/proc/self/fd"
AVAILABLE = os.path.isdir(PROC_FD)
"""Whether descriptors can be listed (Linux /proc); checked once, not by each worker."""

Descriptor = tuple[int, int, int, int]
"""An open descriptor of this process: (fd, st_mode, st_dev, st_ino), as ``fstat`` found it.
A plain tuple: a worker builds one per descriptor right after the fork, where every
allocation copies a page shared with the parent."""


def scan() -> tuple[Descriptor, ...]:
    """Every open descriptor of this process, now (``native.descriptor_table``)."""
    return native.descriptor_table()


# ((pid, fork generation), table) of the fork whose hooks are running in this process.
_listed: tuple[tuple[int, int], tuple[Descriptor, ...]] | None = None


def _fork_key() -> tuple[int, int]:
    return os.getpid(), native.fork_generation()


# In the parent, from a worker fork's `before` phase to its `after_in_parent`:
# ((pid, fork generation), table); the forking thread's, which the worker inherits.
_at_fork = threading.local()


def record_at_fork() -> None:
    """In the parent, before a worker fork: list the table for the worker (once per fork)."""
    key = _fork_key()
    recorded = getattr(_at_fork, "table", None)
    if recorded is None or recorded[0] != key:
        _at_fork.table = (key, scan())


def forget_at_fork() -> None:
    """In the parent, after the fork."""
    _at_fork.table = None


def inherited() -> tuple[Descriptor, ...]:
    """In a worker's fork hooks: the table as the parent listed it right before the fork,
    else as the first hook to ask found it."""
    global _listed
    key = _fork_key()
    if _listed is None or _listed[0] != key:
        recorded = getattr(_at_fork, "table", None)
        _at_fork.table = None
        if recorded is not None and recorded[0] == (os.getppid(), key[1] - 1):
            _listed = (key, recorded[1])
        else:
            _listed = (key, scan())
    return _listed[1]


def forget() -> None:
    """Drop the list: called by its last reader, so that later calls in this process list afresh."""
    global _listed
    _listed = None
