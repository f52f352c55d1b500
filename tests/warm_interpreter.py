"""A warm interpreter: torch imported once, then a fork of it for each test child.

``import torch`` costs about 1.3 CPU-seconds, and the suite starts a few hundred
child interpreters per run: on a 2-core CI machine that alone was a quarter of
the run. ``tests/subproc.py`` starts this program once per test process and asks
it, over a Unix socket, to fork a child that runs ``python -c CODE``,
``python SCRIPT ARGS`` or ``python -m MODULE ARGS``, as ``python`` would: its own
session (process group), the given stdout/stderr, cwd, environment and
``sys.argv``, a fresh ``__main__``, and Python's own handling of the end (exit code,
traceback, ``KeyboardInterrupt`` as SIGINT, non-daemon threads, atexit, ``__main__``'s
objects finalized), without tearing down every module at exit.

What differs from a fresh interpreter, and why it is harmless for the children that
use it: torch (with numpy) is already imported, so environment variables that a
native library reads when it loads (``OMP_NUM_THREADS``, ...) cannot change;
``tests/subproc.py`` starts a fresh interpreter whenever a child's environment
differs in anything but the variables read later (:data:`LATE_VARIABLES`), and for
tests marked ``fresh_interpreter`` (thread pools live at start, import costs, start
costs). numpy's global random state is reseeded in each child.

Protocol (SOCK_SEQPACKET, JSON messages): the client sends
``{"argv": [...], "env": {...}, "cwd": ...}`` with two descriptors (stdout,
stderr); the server answers ``{"started": pid}``, and later ``{"exited": pid,
"code": returncode}`` (negative: killed by that signal), as ``subprocess`` reports it.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import types

LATE_VARIABLES = ("SAFELOADER_", "TMPDIR", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                  "GLOO_SOCKET_IFNAME", "RAY_", "PYTHONPATH", "PYTEST_")
"""Variables (or prefixes) that nothing imported here reads before a child runs: a child whose
environment differs from this server's only in these runs here. PYTHONPATH is applied to sys.path."""


def _run_child(request: dict, out: int, err: int) -> None:
    """In the forked child: become ``python <argv>``, run it, and end as ``python`` ends."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (devnull, out, err):
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    try:
        _run_program(request["argv"], request["env"], main)
        code = 0
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except BaseException as error:  # what the interpreter does with an uncaught exception
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
        trace = error.__traceback__
        while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
            trace = trace.tb_next  # the traceback starts in the program, as the interpreter's does
        sys.excepthook(type(error), error.with_traceback(trace), trace)
        del error
    _end(main, code)


def _run_program(argv: list[str], env: dict[str, str], main: types.ModuleType) -> None:
    python_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    inherited = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[:] = ["", *python_path, *inherited]
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        import runpy

        sys.argv = [argv[1], *argv[2:]]
        sys.path[:] = [os.getcwd(), *python_path, *inherited]
        runpy._run_module_as_main(argv[1])  # what `python -m` itself calls
    else:
        path = os.path.abspath(argv[0])
        sys.argv = list(argv)
        sys.path[:] = [os.path.dirname(os.path.realpath(path)), *python_path, *inherited]
        main.__file__ = path
        main.__cached__ = None
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec"), main.__dict__)


def _exit_code(code: object) -> int:
    """SystemExit's argument as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _end(main: types.ModuleType, code: int) -> None:
    """The interpreter's own end, in its order: wait for non-daemon threads, run atexit
    callbacks, drop ``__main__``'s objects (their finalizers run: a loader iterator left at
    module level shuts its workers down), flush. Then leave without tearing down every module
    torch loaded: that teardown costs about 0.5 CPU-seconds and shows a child nothing."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        main.__dict__.clear()
        gc.collect()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        if code == -signal.SIGINT:  # as Python does after an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:  # the test process is gone: serve() ends at its next read
        pass


def serve(sock: socket.socket) -> None:
    """Fork a child per request until the client closes its end; report each child's exit."""
    while True:
        ready, _, _ = select.select([sock], [], [], 0.05)
        if ready:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
            if not data:
                return
            pid = os.fork()
            if pid == 0:
                sock.close()
                _run_child(json.loads(data), *fds)
            for fd in fds:
                os.close(fd)
            _send(sock, {"started": pid})
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


_SERVER_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]

if __name__ == "__main__":
    import numpy  # noqa: F401
    import torch
    import torch.utils.data  # noqa: F401

    serve(socket.socket(fileno=int(sys.argv[1])))
