"""The process's forks and threads, in pure Python: the fork count, the thread census
(csrc/fork_generation.c, csrc/threads.c); glibc's exit-handler lock in a fork child and the C
path of later forks need the extension (csrc/exit_lock.c, csrc/fast_fork.c) and do nothing here."""

from __future__ import annotations

import os

_fork_generation = 0  # module state: the process's own count, as the C extension's is
_counted_pid = os.getpid()  # the process _fork_generation was counted for


def _on_fork_child() -> None:
    """Count the fork that made this process, once, whoever asks first (why: docs/internals.md)."""
    global _fork_generation, _counted_pid
    pid = os.getpid()
    if pid != _counted_pid:
        _counted_pid = pid
        _fork_generation += 1


os.register_at_fork(after_in_child=_on_fork_child)  # counts forks that nothing reads the counter in


def fork_generation() -> int:
    """Number of forks this process descends from since safeloader was imported."""
    _on_fork_child()
    return _fork_generation


def thread_ids() -> list[int]:
    """Sorted kernel thread ids of every OS thread of this process."""
    return sorted(int(name) for name in os.listdir("/proc/self/task"))


def threads_within(known: tuple[int, ...]) -> bool:
    """Whether every thread of this process now is in ``known`` (thread ids, sorted)."""
    return set(thread_ids()) <= set(known)


def exit_handler_lock() -> tuple[int, bool]:
    """``(0, False)``: without the C extension glibc's exit-handler lock is neither found nor
    released in a fork child (a worker waiting for it is named by the stall report)."""
    return 0, False


# The C path of a start's later worker forks (csrc/fast_fork.c) needs the C extension: here it is
# never armed, and every fork takes the registry's Python path.


def fast_fork_arm(
    thread_ids: object, counters: object, modules_state: object, globals: object, empty: object, kinds_mask: object,
    launch_code: object, target: object, positions: object, num_workers: object, launches: object, clock: object,
    gc_state: object,
) -> bool:
    return False


def fast_fork_disarm() -> int:
    return 0


def fast_fork_before() -> bool:
    return False


def fast_fork_after_in_parent() -> bool:
    return False


def fast_fork_in_child() -> tuple[int, int] | None:
    return None


def fast_fork_python_fork(open: bool) -> None:
    return None
