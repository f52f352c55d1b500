"""numpy's global RandomState, left locked in a forked worker by a parent thread that was drawing from it at the
fork, made new there before torch's worker loop seeds it
(why: docs/internals.md, ``safeloader.backends.torch_state``)."""

from __future__ import annotations

import sys


def release_abandoned() -> bool:
    """In a forked child: give numpy's global RandomState a new bit generator (and so a new lock) if a
    thread the child does not have holds its lock. True when it did."""
    state = getattr(sys.modules.get("numpy.random.mtrand"), "_rand", None)
    lock = getattr(getattr(state, "_bit_generator", None), "lock", None)
    if state is None or lock is None:
        return False  # numpy.random not imported before the fork: nothing inherited
    # The only thread here is the one that forked, and it was starting a worker, not drawing: a lock
    # it cannot take is held by a thread that does not exist in this process.
    if lock.acquire(blocking=False):
        lock.release()
        return False
    state.__init__()  # a fresh MT19937 with its own lock; torch's worker loop seeds it next
    return True
