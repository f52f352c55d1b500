"""This process's descriptor table, listed once per worker fork for the hooks that read it.

The "sockets" and "files" hooks both need the type (and, for regular files,
the device and inode) of every descriptor a worker inherited. Listing
``/proc/self/fd`` and ``fstat``-ing each entry is a system call per
descriptor, and system calls are most of what these hooks cost, so the first
of them to ask in a worker lists the table and the other reuses it: the
hooks run one after the other in the forking thread, and the only
descriptors they change in between are sockets the "sockets" hook replaces by
other sockets and files the "h5py" hook privatizes (which the "files" hook
skips anyway, see ``_reopen.private_fds``).

The list belongs to one fork: a process keeps it until its last reader is
done (``forget``), and a process forked from it never sees it (it is keyed by
pid and fork generation).
"""

from __future__ import annotations

import os

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


def inherited() -> tuple[Descriptor, ...]:
    """In a worker's fork hooks: the table as the first hook to ask found it."""
    global _listed
    key = _fork_key()
    if _listed is None or _listed[0] != key:
        _listed = (key, scan())
    return _listed[1]


def forget() -> None:
    """Drop the list: called by its last reader, so that later calls in this process list afresh."""
    global _listed
    _listed = None
