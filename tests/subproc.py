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
    """Run ``code`` in a fresh interpreter; kill it and its workers at ``timeout`` seconds."""
    child_env = {**os.environ, **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
        cwd=cwd,
        start_new_session=True,  # its own process group, so workers die with it
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        return Result(process.returncode, stdout, stderr, timed_out=False)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return Result(None, stdout, stderr, timed_out=True)


def check_python(code: str, timeout: float, env: dict[str, str] | None = None) -> Result:
    """Like ``run_python``, but a timeout or a non-zero exit fails the test with the child's output."""
    result = run_python(code, timeout, env)
    if result.timed_out or result.returncode != 0:
        raise AssertionError(f"child process failed:\n{result}")
    return result
