"""Run Python code, or a script of ``tests/children``, in a child process with a deadline.

A deadlock must fail a test, never hang it: on timeout the child's whole
process group (its DataLoader workers included) is killed and the result says
so, with everything the child printed.

A test that expects a hang (torch's own loader on the code safeloader fixes)
passes ``expect_hang=True``: the hang is then confirmed as soon as it is
certain, not at the deadline. Certain means: for ``HANG_QUIET`` seconds the
main thread of every process of the child's tree stayed asleep in the same
kernel wait using no CPU, the tree as a whole stayed near idle, and nothing was
printed. A child that is slow but working uses CPU or prints, and is left to
its deadline.

A child is a fork of a warm interpreter that has already imported torch
(``tests/warm_interpreter.py``: a child then costs about 0.2 CPU-seconds
instead of 1.6), unless its environment differs in a variable read at start-up,
it passes interpreter options, or its test is marked ``fresh_interpreter``
(the test is about what a fresh process has imported or running). Either way
it is its own process group, with its own stdout, stderr, cwd and environment.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from . import warm_interpreter

REPO = str(Path(__file__).resolve().parent.parent)
CHILDREN = Path(__file__).resolve().parent / "children"
"""The child scripts: real files, which the linter checks; parameters come from argv or the environment."""


@dataclass
class Result:
    returncode: int | None  # None: killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool  # killed before it ended: at the deadline, or as soon as its hang was certain
    hang: str = ""  # with expect_hang: each thread's kernel wait when the hang was confirmed
    at_deadline: str = ""  # killed at the deadline: each process's threads and kernel waits then

    def __str__(self) -> str:
        status = "TIMED OUT" if self.timed_out else f"exit {self.returncode}"
        if self.hang:
            status = f"HUNG (confirmed: no main thread ran for {HANG_QUIET:g} s)\n{self.hang}"
        elif self.at_deadline:
            status = f"TIMED OUT; the child's processes then:\n{self.at_deadline}"
        return f"[{status}]\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


HANG_QUIET = 4.0
"""Seconds of a whole process tree stuck before a hang counts as certain (torch's loader wakes
every 5 s, MP_STATUS_CHECK_INTERVAL, and uses no measurable CPU doing so)."""

HANG_TICKS = 10
"""CPU ticks (10 ms each) the whole tree may use during those seconds: a helper thread's timer
(a queue feeder, an event loop) wakes now and then; a tree doing work uses far more."""

_POLL = 0.25

test_deadline: float | None = None
"""When the running test's own timeout (pytest-timeout) fires, on ``time.monotonic()``'s clock; set by
conftest. A child's deadline is kept a few seconds inside it, so that a hung child fails the test
here, with its output and its process group killed, rather than in pytest-timeout's dump."""

_DEADLINE_MARGIN = 5.0


def _within_test_deadline(timeout: float) -> float:
    if test_deadline is None:
        return timeout
    return max(1.0, min(timeout, test_deadline - _DEADLINE_MARGIN - time.monotonic()))


def _tree_state(root: int) -> tuple[dict[int, tuple[str, str]], int] | None:
    """Each process's main thread (pid -> (state, kernel wait channel)) and the CPU
    ticks of all threads of ``root``'s tree together; None while a main thread is runnable, in
    uninterruptible I/O (working) or in ``time.sleep`` (a polling loop waits for time, not for
    something that may never come), or while the tree cannot be read."""
    try:
        pids = [root] + [child.pid for child in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    mains, total = {}, 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                state = fields[0]
                total += int(fields[11]) + int(fields[12])
                if int(tid) == pid:
                    with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                        wchan = f.read()
                    if state in "RD" or "nanosleep" in wchan:  # working, or waiting for time (a polling loop)
                        return None
                    mains[pid] = (state, wchan)
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread or process that just ended is not hung
    return mains, total


def _describe(mains: dict[int, tuple[str, str]]) -> str:
    return "\n".join(
        f"  pid {pid}: main thread {state} in {wchan or '?'}" for pid, (state, wchan) in mains.items()
    )


def _threads_at_deadline(root: int) -> str:
    """Every thread of ``root``'s tree: name, state, kernel wait and system call, so that a
    timeout on CI says which process hung where (a deadlock shows as futex waits)."""
    try:
        processes = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return ""
    lines = []
    for process in processes:
        try:
            lines.append(f"  pid {process.pid} (parent {process.ppid()}): {' '.join(process.cmdline())[:120]}")
            for tid in sorted(os.listdir(f"/proc/{process.pid}/task"), key=int):
                task = f"/proc/{process.pid}/task/{tid}"
                with open(f"{task}/stat") as f:
                    name, fields = f.read().split("(", 1)[1].rsplit(")", 1)
                with open(f"{task}/wchan") as f:
                    wchan = f.read()
                try:
                    with open(f"{task}/syscall") as f:
                        syscall = f.read().split()[0]
                except (OSError, IndexError):  # not readable without ptrace rights
                    syscall = "?"
                lines.append(f"    tid {tid} {name!r}: {fields.split()[0]} in {wchan or '?'}, syscall {syscall}")
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    return "\n".join(lines)


def _wait(process: subprocess.Popen, timeout: float, expect_hang: bool, out, err) -> tuple[int | None, str, str]:
    """Wait for ``process`` until ``timeout``; with ``expect_hang``, return early once its hang is
    certain: for ``HANG_QUIET`` seconds every process's main thread asleep in the same wait
    (not ``time.sleep``), the whole tree near idle and printing nothing. Returns (exit code or
    None, the hang's evidence or "", the threads at the deadline or "")."""
    if not expect_hang:
        try:
            return process.wait(timeout=timeout), "", ""
        except subprocess.TimeoutExpired:
            return None, "", _threads_at_deadline(process.pid)
    deadline = time.monotonic() + timeout
    since, mark = time.monotonic(), None
    while time.monotonic() < deadline:
        try:
            return process.wait(timeout=_POLL), "", ""
        except subprocess.TimeoutExpired:
            pass
        state = _tree_state(process.pid)
        if state is None:
            since, mark = time.monotonic(), None
            continue
        mains, ticks = state
        now = (os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size, mains)
        if mark is None or now != mark[0] or ticks - mark[1] > HANG_TICKS:
            since, mark = time.monotonic(), (now, ticks)
        elif time.monotonic() - since >= HANG_QUIET:
            return None, _describe(mains), ""
    return None, "", _threads_at_deadline(process.pid)


def _run(
    command: list[str], timeout: float, env: dict[str, str] | None, cwd: str | None, expect_hang: bool = False
) -> Result:
    """Run ``command``; kill it and its workers at ``timeout`` seconds.

    Output goes to files, not pipes, and the deadline is on the child itself:
    a worker it left behind (say, one hung in the very way a test shows)
    would hold a pipe open and make a finished child look hung. Whatever the
    child leaves in its process group is killed when it ends.
    """
    child_env = {**os.environ, **(env or {})}
    timeout = _within_test_deadline(timeout)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = _start_warm(command, child_env, cwd, out, err)
        if process is None:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=err,
                text=True,
                env=child_env,
                cwd=cwd,
                start_new_session=True,  # its own process group, so workers die with it
            )
        returncode, hang, at_deadline = _wait(process, timeout, expect_hang, out, err)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is empty: nothing was left behind
            pass
        process.wait()
        out.seek(0)
        err.seek(0)
        return Result(
            returncode, out.read(), err.read(), timed_out=returncode is None, hang=hang, at_deadline=at_deadline
        )


class WarmChild:
    """A child forked by the warm interpreter: the part of ``subprocess.Popen`` that ``_run`` uses."""

    def __init__(self, server: WarmServer, pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return self.returncode


class WarmServer:
    """``tests/warm_interpreter.py``, started on first use with one environment, for children
    whose command line is ``python -c/-m/SCRIPT ...`` and whose environment differs from that
    one only in variables read after start-up. A child forked from it skips importing torch
    (about 1.3 CPU-seconds, and 0.5 more to tear it down at exit; a few hundred children per run)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.exits: dict[int, int] = {}

    def start(self, command: list[str], env: dict[str, str], cwd: str | None, out, err) -> WarmChild:
        """Fork ``command`` from this warm interpreter (started now if it is not running)."""
        if self.sock is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.warm_interpreter", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=REPO,
                start_new_session=True,  # a test's signal to its own process group is not for this server
            )
            theirs.close()
            self.sock = ours
        request = {"argv": command[1:], "env": env, "cwd": os.path.abspath(cwd or os.getcwd())}
        socket.send_fds(self.sock, [json.dumps(request).encode()], [out.fileno(), err.fileno()])
        while True:
            message = self._receive(60.0)
            if message is None:
                raise OSError("the warm interpreter did not answer in 60 s")
            if "started" in message:
                return WarmChild(self, message["started"])

    def _receive(self, timeout: float | None) -> dict | None:
        assert self.sock is not None
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        data = self.sock.recv(1 << 16)
        if not data:
            raise OSError("the warm interpreter exited")
        message = json.loads(data)
        if "exited" in message:
            self.exits[message["exited"]] = message["code"]
        return message

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exits:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._receive(remaining)
        return self.exits.pop(pid)

    def close(self) -> None:
        """End the server (it exits when its socket closes); its children are the tests' to end."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


_WARM_SERVERS = 2
"""Warm interpreters kept per test process, each for one environment: the suite's own, and one a
test set (in-process code can set variables such as OMP_NUM_THREADS for good, and tests pass some)."""

_warm_servers: dict[tuple, WarmServer] = {}
_warm_failures = 0

warm_allowed = True
"""Off for tests marked ``fresh_interpreter`` (set by conftest): every child starts from scratch."""


def _start_warm(command: list[str], env: dict[str, str], cwd: str | None, out, err) -> WarmChild | None:
    """``command`` forked from the warm interpreter for ``env``'s start-up variables, or None
    where it must start from scratch: a test marked ``fresh_interpreter``, an interpreter option,
    a command that is not Python, or warm interpreters that failed three times."""
    global _warm_failures
    if not warm_allowed or _warm_failures >= 3 or len(command) < 2 or command[0] != sys.executable:
        return None
    if command[1].startswith("-") and command[1] not in ("-c", "-m"):
        return None  # an interpreter option (-W, -X, -I, ...)
    key = tuple(sorted((k, v) for k, v in env.items() if not k.startswith(warm_interpreter.LATE_VARIABLES)))
    server = _warm_servers.pop(key, None)
    if server is None:
        if len(_warm_servers) >= _WARM_SERVERS:
            _warm_servers.pop(next(iter(_warm_servers))).close()  # the least recently used
        if not _warm_servers:
            atexit.register(_close_warm_servers)
        server = WarmServer(dict(env))
    _warm_servers[key] = server
    try:
        return server.start(command, env, cwd, out, err)
    except OSError as error:
        _warm_failures += 1
        print(f"tests/subproc.py: a warm interpreter failed ({error}); a fresh one runs this child", file=sys.stderr)
        server.close()
        del _warm_servers[key]
        return None


def _close_warm_servers() -> None:
    while _warm_servers:
        _warm_servers.popitem()[1].close()


def warm_server_pids() -> set[int]:
    """The warm interpreters, which live as long as the test process (their children do not)."""
    return {server.process.pid for server in _warm_servers.values() if server.process is not None}


def _checked(result: Result) -> Result:
    if result.timed_out or result.returncode != 0:
        raise AssertionError(f"child process failed:\n{result}")
    return result


def run_python(
    code: str, timeout: float, env: dict[str, str] | None = None, cwd: str | None = None, expect_hang: bool = False
) -> Result:
    """Run ``code`` as ``python -c`` does, in a child; kill it and its workers at ``timeout``
    seconds, or, with ``expect_hang``, as soon as their hang is certain."""
    return _run([sys.executable, "-c", textwrap.dedent(code)], timeout, env, cwd, expect_hang)


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
    expect_hang: bool = False,
) -> Result:
    """Run the script ``script`` (a name in ``tests/children``, or a path) with ``args`` as its
    argv, like ``run_python``: same deadline, same kill of the process group, same ``expect_hang``."""
    command, child_env = script_command(script, *args, env=env)
    return _run(command, timeout, child_env, cwd, expect_hang)


def check_script(
    script: str | os.PathLike,
    *args: object,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Result:
    """Like ``run_script``, but a timeout or a non-zero exit fails the test with the child's output."""
    return _checked(run_script(script, *args, timeout=timeout, env=env, cwd=cwd))


def run_stopped(script: str, *args: object, marker: str, delay: float, seconds: float) -> tuple[int | None, str]:
    """Run the script ``script``; once it printed ``marker`` and ``delay`` more seconds passed, stop
    its whole process group (as Ctrl-Z does) for ``seconds``, continue it, and give it 60 s to end.
    Returns (its exit code, or None if it did not end; everything it printed)."""
    command, env = script_command(script, *args)
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and child.poll() is None:
                out.seek(0)
                if marker in out.read():
                    break
                time.sleep(0.05)
            time.sleep(delay)
            os.killpg(child.pid, signal.SIGSTOP)
            time.sleep(seconds)
            os.killpg(child.pid, signal.SIGCONT)
            try:
                code: int | None = child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = None
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
        out.seek(0)
        return code, out.read()
