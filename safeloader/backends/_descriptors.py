"""This process's descriptor table, listed once per worker fork for the hooks that read it.

How it works and why: docs/internals.md, ``safeloader.backends._descriptors``.
"""

from __future__ import annotations

import os

from .. import _context, native

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


def at_fork() -> tuple[Descriptor, ...]:
    """The table for the hooks of the fork under way: listed once per fork, by the parent's first
    ``before`` to ask (the worker inherits that list), else by the worker's first hook to ask."""
    return _context.fork_memo(_MEMO, scan)


_MEMO = "memo:descriptors"


def kinds_at_fork() -> int:
    """``native.descriptor_kinds()`` for the fork under way, asked once by its parent's hooks."""
    if not AVAILABLE:
        return 0
    return _context.fork_memo(_KINDS_MEMO, native.descriptor_kinds)


_KINDS_MEMO = "memo:descriptor kinds"
