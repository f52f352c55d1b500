"""Shared fixtures: every test that forks must leave no process behind, and a test session no file."""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
import time

import psutil
import pytest

import safeloader

from . import subproc

# -- the session's own temporary folder ------------------------------------------------------
# Children killed at a deadline leave multiprocessing's pymp-* folders (with their listener
# sockets), tests leave data folders, and Ray, torchelastic, torchinductor and pytest's tmp_path
# write under the temporary folder: the whole session writes into one folder of its own, made
# here and removed at the end. Everything honours TMPDIR: pytest-xdist's workers, the children of
# tests/subproc.py and its warm interpreters inherit it. The name is short: a Unix socket's path
# (multiprocessing's, Ray's) under it must fit in 107 bytes.

SESSION_TMPDIR = "SAFELOADER_TEST_SESSION_TMPDIR"
"""Set while a session runs: its temporary folder (TMPDIR), which its controller removes at the end."""


def _use_tmpdir(folder: str | None) -> None:
    if folder is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = folder
    tempfile.tempdir = None  # tempfile caches its folder: read TMPDIR again


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller made the folder
        return
    tempfile.tempdir = None  # this process may have cached a folder before TMPDIR was last set
    config._safeloader_tmpdir_before = os.environ.get("TMPDIR")
    folder = tempfile.mkdtemp(prefix="slt-")
    config._safeloader_session_tmpdir = folder
    os.environ[SESSION_TMPDIR] = folder
    _use_tmpdir(folder)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    folder = getattr(config, "_safeloader_session_tmpdir", None)
    if folder is None:
        return
    subproc._close_warm_servers()  # they live in the folder until now
    for _ in range(20):  # a service a test stopped (Ray's) may still write a last file as it exits
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.exists(folder):
            break
        time.sleep(0.1)
    os.environ.pop(SESSION_TMPDIR, None)
    _use_tmpdir(config._safeloader_tmpdir_before)


def _is_multiprocessing_service(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker and forkserver live as long as the test process."""
    command = " ".join(process.cmdline())
    return "multiprocessing.resource_tracker" in command or "multiprocessing.forkserver" in command


@pytest.fixture(autouse=True)
def subprocess_deadline(request):
    """Children run by tests/subproc.py end before the test's own pytest-timeout does, and start
    from scratch in tests marked ``fresh_interpreter``."""
    marker = request.node.get_closest_marker("timeout")
    seconds = marker.args[0] if marker is not None and marker.args else request.config.getini("timeout")
    subproc.test_deadline = time.monotonic() + float(seconds) if seconds else None
    subproc.warm_allowed = request.node.get_closest_marker("fresh_interpreter") is None
    yield
    subproc.test_deadline = None
    subproc.warm_allowed = True


_forks = 0
"""Forks of this test process (DataLoader workers, os.fork; subprocess's fork-exec runs no at-fork code)."""


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(before=_count_fork)


def _held() -> tuple[int, set[str], set[str]]:
    """What an unreferenced iterator (or other garbage) can hold: forks so far, this process's threads
    (native ones included) and open descriptors."""
    return _forks, set(os.listdir("/proc/self/task")), set(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_orphan_processes():
    """Fail a test that leaves a child process (a DataLoader worker) running."""
    forks, threads, fds = _held()
    yield
    me = psutil.Process()

    def leftovers():
        found = []
        for process in me.children(recursive=True):
            try:
                if process.pid in subproc.warm_server_pids():  # lives as long as this process; not its children
                    continue
                if process.status() == psutil.STATUS_ZOMBIE or _is_multiprocessing_service(process):
                    continue
                found.append(process)
            except psutil.NoSuchProcess:
                continue
        return found

    # Drop unreferenced iterators, so torch shuts their workers down, and any garbage the test left
    # holding a thread or a descriptor (a later test's fork would see it). A full collection walks
    # every object of this process (400,000 and more: torch, zarr, polars... which the test modules
    # import), 0.3 to 0.8 CPU-seconds, at each of the suite's ~580 teardowns: minutes of CPU. It runs
    # after a test that forked here, or that left a child process, a thread or a descriptor that was
    # not there before. The others (most: their children, run by tests/subproc.py, ended) hold none.
    now_forks, now_threads, now_fds = _held()
    if now_forks != forks or now_threads - threads or now_fds - fds or leftovers():
        gc.collect()
    deadline = time.monotonic() + 10
    while True:
        children = leftovers()
        if not children or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for child in children:
        child.kill()
    assert not children, f"test left processes running: {[(p.pid, p.name()) for p in children]}"


@pytest.fixture
def clean_registry():
    """Registry as it was before the test: user hooks removed, switches reset."""
    before = {hook.name for hook in safeloader.hooks()}
    disabled = {hook.name for hook in safeloader.hooks() if not hook.enabled}
    options = safeloader.get_options()
    yield
    for hook in safeloader.hooks():
        if hook.name not in before:
            safeloader.unregister(hook)
        elif hook.enabled == (hook.name in disabled):
            (safeloader.disable if hook.name in disabled else safeloader.enable)(hook)
    safeloader.configure(**dataclasses.asdict(options))
    safeloader.uninstall()
