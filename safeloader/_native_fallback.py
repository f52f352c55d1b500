"""Pure-Python stand-in for the ``safeloader._native`` C extension.

Same functions, same answers, with one documented gap: the fork counter is
driven by ``os.register_at_fork``, so it misses forks that bypass ``os.fork``
(a C library calling ``fork()`` directly). The C version counts those too.
"""

from __future__ import annotations

import os

_fork_generation = 0


def _on_fork_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_on_fork_child)


def fork_generation() -> int:
    """Number of forks this process descends from since safeloader was imported."""
    return _fork_generation


def thread_ids() -> list[int]:
    """Sorted kernel thread ids of every OS thread of this process."""
    return sorted(int(name) for name in os.listdir("/proc/self/task"))
