"""For child scripts: the worker processes still alive once those told to stop had time to go."""

import time

import psutil


def alive_children() -> list[psutil.Process]:
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def workers_left(seconds: float = 5.0) -> list[psutil.Process]:
    """Child processes alive after up to ``seconds``: a worker told to stop (or SIGTERMed by torch)
    takes a moment to go."""
    deadline = time.monotonic() + seconds
    while alive_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive_children()
