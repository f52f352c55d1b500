"""Run Python code, or a script of ``tests/children``, in a child process with a deadline.

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
from pathlib import Path

REPO = str(Path(__file__).resolve().parent.parent)
CHILDREN = Path(__file__).resolve().parent / "children"
"""The child scripts: real files, which the linter checks; parameters come from argv or the environment."""


@dataclass
class Result:
    returncode: int | None  # None: killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool

    def __str__(self) -> str:
        status = "TIMED OUT" if self.timed_out else f"exit {self.returncode}"
        return f"[{status}]\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def _run(command: list[str], timeout: float, env: dict[str, str] | None, cwd: str | None) -> Result:
    """Run ``command``; kill it and its workers at ``timeout`` seconds.

    Output goes to files, not pipes, and the deadline is on the child itself:
    a worker it left behind (say, one hung in the very way a test shows)
    would hold a pipe open and make a finished child look hung. Whatever the
    child leaves in its process group is killed when it ends.
    """
    child_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            command,
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


def _checked(result: Result) -> Result:
    if result.timed_out or result.returncode != 0:
        raise AssertionError(f"child process failed:\n{result}")
    return result


def run_python(code: str, timeout: float, env: dict[str, str] | None = None, cwd: str | None = None) -> Result:
    """Run ``code`` in a fresh interpreter (``python -c``); kill it and its workers at ``timeout`` seconds."""
    return _run([sys.executable, "-c", textwrap.dedent(code)], timeout, env, cwd)


def check_python(code: str, timeout: float, env: dict[str, str] | None = None) -> Result:
    """Like ``run_python``, but a timeout or a non-zero exit fails the test with the child's output."""
    return _checked(run_python(code, timeout, env))


def script_command(script: str | os.PathLike, *args: object, env: dict[str, str] | None = None):
    """The command line and environment that run the script ``script`` (a name in
    ``tests/children``, or a path) with ``args`` as its argv: for ``run_script``, and for a
    test that drives the child itself (signals, say).

    ``python path`` puts the script's own folder first on sys.path, not the
    current directory: the repository root goes first on PYTHONPATH, so that
    the script imports ``safeloader``, ``tests`` and ``benchmarks`` from this
    checkout, as a ``python -c`` child run from the root does.
    """
    child_env = {**os.environ, **(env or {})}
    python_path = child_env.get("PYTHONPATH")
    child_env["PYTHONPATH"] = REPO + (os.pathsep + python_path if python_path else "")
    return [sys.executable, str(CHILDREN / script), *map(str, args)], child_env


def run_script(
    script: str | os.PathLike,
    *args: object,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Result:
    """Run the script ``script`` (a name in ``tests/children``, or a path) with ``args`` as its
    argv, like ``run_python``: same deadline, same kill of the process group."""
    command, child_env = script_command(script, *args, env=env)
    return _run(command, timeout, child_env, cwd)


def check_script(
    script: str | os.PathLike,
    *args: object,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Result:
    """Like ``run_script``, but a timeout or a non-zero exit fails the test with the child's output."""
    return _checked(run_script(script, *args, timeout=timeout, env=env, cwd=cwd))
