"""Shared fixtures: every test that forks must leave no process behind."""

from __future__ import annotations

import dataclasses
import gc
import time

import psutil
import pytest

import safeloader

from . import subproc


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


@pytest.fixture(autouse=True)
def no_orphan_processes():
    """Fail a test that leaves a child process (a DataLoader worker) running."""
    yield
    gc.collect()  # drop unreferenced iterators, so torch shuts their workers down
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
