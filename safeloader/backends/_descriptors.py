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
from dataclasses import dataclass

from .. import native

PROC_FD = "/proc/self/fd"


@dataclass(frozen=True)
class Descriptor:
    """An open descriptor of this process, as ``fstat`` found it."""

    fd: int
    mode: int
    dev: int
    ino: int


def scan() -> tuple[Descriptor, ...]:
    """Every open descriptor of this process, now."""
    table = []
    for name in os.listdir(PROC_FD):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:  # the listing's own descriptor, already closed
            continue
        table.append(Descriptor(fd, st.st_mode, st.st_dev, st.st_ino))
    return tuple(table)


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
