"""The test helper that runs children under a deadline: what a timeout on CI leaves to read."""

from __future__ import annotations

import pytest

from .subproc import run_python

pytestmark = pytest.mark.timeout(60)


def test_a_child_killed_at_its_deadline_is_reported_with_each_processs_threads_and_waits():
    # A parent with a sleeping thread and a forked child blocked on a pipe: the report names
    # both processes and every thread's kernel wait (CI's only evidence of where a deadlock sat).
    result = run_python(
        """
        import os, threading, time
        threading.Thread(target=time.sleep, args=(60,), name="sleeper", daemon=True).start()
        read, write = os.pipe()
        if os.fork() == 0:
            os.read(read, 1)
        print("forked", flush=True)
        time.sleep(60)
        """,
        timeout=5,
    )
    assert result.timed_out and result.returncode is None, result
    assert result.stdout == "forked\n", result
    processes = [line for line in result.at_deadline.splitlines() if line.startswith("  pid ")]
    assert len(processes) == 2, result.at_deadline
    assert result.at_deadline.count("nanosleep") == 2, result.at_deadline  # the parent's two threads
    assert "pipe_read" in result.at_deadline or "pipe_wait" in result.at_deadline, result.at_deadline
    assert "TIMED OUT; the child's processes then:" in str(result)
