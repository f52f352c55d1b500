"""A DataLoader worker's descriptor table, grown right after the fork while the worker has one thread.

Why (a grown table waits for an RCU grace period once threads run): docs/internals.md, ``safeloader._fd_table``."""

from __future__ import annotations

from . import native

SPARE = 512
"""Descriptors a worker can open without growing its table again: more than it opens to load (its
queues, shared-memory tensors, sockets and the Dataset's files). The kernel rounds the table up to
a power of two: 1024 slots (8 KiB) for a parent with fewer than 512 descriptors."""


def grow_in_worker() -> None:
    """Make room for ``SPARE`` more descriptors in this worker, up to the ``RLIMIT_NOFILE`` soft limit."""
    try:
        native.reserve_descriptor_slots(SPARE)
    except Exception:  # a table not grown costs time, never correctness: the worker's hooks must run next
        pass
