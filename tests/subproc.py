"""Run Python code in a child process with a deadline.

A deadlock must fail a test, never hang it: on timeout the child's whole
process group (its DataLoader workers included) is killed and the result says
so, with everything the child printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass


@dataclass
class Result:
    returncode: int | None  # None: killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool

    def __str__(self) -> str:
        status = "TIMED OUT" if self.timed_out else f"exit {self.returncode}"
        return f"[{status}]\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def run_python(code: str, timeout: float, env: dict[str, str] | None = None, cwd: str | None = None) -> Result:
    """Run ``code`` in a fresh interpreter; kill it and its workers at ``timeout`` seconds.

    Output goes to files, not pipes, and the deadline is on the child itself:
    a worker it left behind (say, one hung in the very way a test shows)
    would hold a pipe open and make a finished child look hung. Whatever the
    child leaves in its process group is killed when it ends.
    """
    child_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=out,
            stderr=err,
            text=True,
            env=child_env,
            cwd=cwd,
            start_new_session=True,  # its own process group, so workers die with it
        )
        try:
            returncode: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is empty: nothing was left behind
            pass
        process.wait()
        out.seek(0)
        err.seek(0)
        return Result(returncode, out.read(), err.read(), timed_out=returncode is None)


def check_python(code: str, timeout: float, env: dict[str, str] | None = None) -> Result:
    """Like ``run_python``, but a timeout or a non-zero exit fails the test with the child's output."""
    result = run_python(code, timeout, env)
    if result.timed_out or result.returncode != 0:
        raise AssertionError(f"child process failed:\n{result}")
    return result
