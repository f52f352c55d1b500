"""Signals, in pure Python: which are free, whose handler is set, one thread signalled
(csrc/signals.c)."""

from __future__ import annotations

import os


def signal_thread(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to one thread of a process (tgkill), through libc when it has it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    tgkill = getattr(libc, "tgkill", None)
    if tgkill is None:  # glibc < 2.30: only the whole process can be signalled
        if tid != pid:
            raise OSError(f"signal_thread needs tgkill (glibc >= 2.30) for a thread other than the main one, got {tid}")
        os.kill(pid, signum)
        return
    if tgkill(pid, tid, signum) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def keep_errno(signum: int) -> bool:
    """Nothing can be wrapped without the extension: returns False (faulthandler's handler stays
    as it is, and the watchdog samples no running worker with it)."""
    return False


def free_signals(count: int) -> list[int]:
    """Up to ``count`` real-time signals nobody holds, from ``SIGRTMAX`` down: ``SIG_DFL`` for
    Python's signal module and for the kernel (its masks see handlers installed in C too)."""
    import _signal
    import signal

    found: list[int] = []
    for signum in range(signal.SIGRTMAX, signal.SIGRTMIN - 1, -1):
        if len(found) == count:
            break
        try:
            if _signal.getsignal(signum) == _signal.SIG_DFL and signal_handler_address(signum) == 0:
                found.append(signum)
        except (OSError, ValueError):
            continue
    return found


def signal_handler_address(signum: int) -> int:
    """0 for ``SIG_DFL``, 1 for ``SIG_IGN``, 2 for any handler (the kernel's caught and
    ignored masks in /proc/self/status: they see handlers installed in C too)."""
    caught = ignored = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                caught = int(line.split()[1], 16)
            elif line.startswith("SigIgn:"):
                ignored = int(line.split()[1], 16)
    bit = 1 << (signum - 1)
    return 2 if caught & bit else 1 if ignored & bit else 0
