"""A DataLoader worker's descriptor table, grown right after the fork while the worker has one thread.

Linux keeps a process's descriptors in a table of 64 slots, then of a power of two, and grows it
when a new descriptor's number does not fit. In a process with more than one thread it then waits
for an RCU grace period first (``expand_fdtable`` in fs/file.c: ``synchronize_rcu()`` when the
table is shared), measured at 10-25 ms on a 16-core machine. A forked worker inherits a table just
large enough for its parent's descriptors, then opens its own (torch's shared-memory tensors and the
sockets that pass them) with its queue-feeder and resource-sharer threads running: a parent whose
descriptors end just below a power of two (a CUDA process: 46 of 64) makes each worker wait there,
with torch's loader as with this one. Grown before any thread of the worker starts, the table costs
one allocation and no wait.
"""

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
