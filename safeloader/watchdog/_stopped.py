"""Workers stopped (job control, ``SIGSTOP``, a debugger) told from stalled ones, asked of the kernel:
safeloader installs no ``SIGCONT`` handler, so a user's, installed at any time, changes nothing.

How it works and why: docs/internals.md, ``safeloader.watchdog``.
"""

from __future__ import annotations

import os

from ..errors import WorkerStoppedWarning

__all__ = ["continued_since_asked", "stop_state", "warn_stopped"]


def continued_since_asked(pid: int) -> bool:
    """Whether child ``pid`` was continued after a stop since the last time this was asked.

    ``waitid(WCONTINUED)`` without ``WEXITED``: it reaps nothing, and torch's and
    multiprocessing's waits (``WEXITED`` only) never consume this report. False for
    a process that is not this one's child (a forkserver's worker).
    """
    try:
        result = os.waitid(os.P_PID, pid, os.WCONTINUED | os.WNOHANG)
    except (ChildProcessError, OSError):
        return False
    return result is not None and result.si_code == os.CLD_CONTINUED


def stop_state(pid: int) -> str:
    """"T" if process ``pid`` is stopped now by a signal (job control, ``SIGSTOP``), "t" if a tracer
    (a debugger) holds it stopped, "" otherwise."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return fields[0] if fields and fields[0] in ("T", "t") else ""


def warn_stopped(worker_id: int, pid: int, waited: float, stop: str) -> None:
    import warnings

    if stop == "t":
        how = "a debugger (ptrace) holds it stopped"
    else:
        how = f"it was stopped (SIGSTOP); `kill -CONT {pid}` resumes it"
    warnings.warn(
        f"safeloader: DataLoader worker {worker_id} (pid {pid}) has made no progress for {waited:.0f} s and is "
        f"stopped while the main process runs: {how}. The loader waits for it; a stopped worker is not "
        "counted as stalled.",
        WorkerStoppedWarning,
        stacklevel=2,
    )
