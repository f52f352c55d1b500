"""A loader start's later worker forks take the C path (csrc/fast_fork.c) only where it stands in
for every hook, and their workers get what the Python path would have given them."""

from __future__ import annotations

import json

import pytest

import safeloader

from .subproc import check_script

WORKERS = 4


def _starts(mode: str, starts: int = 1, env: dict[str, str] | None = None) -> list[dict]:
    return json.loads(check_script("fast_forks.py", mode, starts, timeout=90, env=env).stdout.splitlines()[-1])


def _check_items(start: dict) -> None:
    items = start["items"]
    assert sorted(item["index"] for item in items) == list(range(32)), items  # each item once
    for item in items:
        # Each worker knows which it is, as torch's worker info says, and froze what it inherited:
        # gc was paused at its fork (C path or Python path alike) and resumed once frozen.
        assert item["context_worker"] == item["worker"] and item["context_workers"] == WORKERS, item
        assert item["gc_paused_at_fork"] and item["gc_enabled"] and item["gc_frozen"], item
    assert {item["worker"] for item in items} == set(range(WORKERS)), items


@pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")
def test_a_starts_later_forks_run_no_python_code_of_safeloader_in_the_parent():
    # Each later fork's parent runs the two callbacks' first lines, nothing else: every other
    # object Python touches there is a page copied, once for each worker already forked.
    for start in _starts("plain", starts=2):
        assert start["python_path"] == [0], start["python_path"]
        first, *later = start["between"]
        assert len(first["ran"]) > 10, first  # the start's first fork: the Python path, every hook
        for fork in later:
            assert fork["ran"] == ["_on_after_in_parent", "_on_before"], fork
        for fork in start["between"]:
            # gc paused around each fork only (issue 42, item 4: not while torch runs the sampler),
            # the pin-memory gate closed from the first fork to the last, and the watchdog's clock
            # for each worker set at its fork
            assert fork["gc_enabled"] and fork["gate_closed"] and fork["clock_set_at_fork"], fork
        assert start["after_start"] == {"gc_enabled": True, "gate_closed": False}, start["after_start"]
        _check_items(start)


def test_without_the_c_extension_every_fork_takes_the_python_path():
    # The fallback: the same loader, the same workers, every fork on the registry's Python path.
    (start,) = _starts("plain", env={"SAFELOADER_DISABLE_NATIVE": "1"})
    assert start["python_path"] == [0, 1, 2, 3], start["python_path"]
    assert all(fork["clock_set_at_fork"] and fork["gc_enabled"] for fork in start["between"]), start["between"]
    _check_items(start)


@pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")
def test_a_thread_started_between_two_forks_sends_the_next_one_down_the_python_path():
    # Its plans are made again there (a new thread may be a pool a backend must handle); the
    # fork after it takes the C path again, checked against the new record.
    for start in _starts("thread", starts=2):
        assert start["python_path"] == [0, 2], start["python_path"]
        _check_items(start)


@pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")
def test_a_file_opened_read_only_between_two_forks_sends_every_later_fork_down_the_python_path():
    # The files hook has work from then on (it privatizes the file in each worker).
    first, second = _starts("file", starts=2)
    assert first["python_path"] == [0, 2, 3], first["python_path"]
    assert second["python_path"] == [0, 1, 2, 3], second["python_path"]  # the file is still open
    _check_items(first)
    _check_items(second)


@pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")
def test_a_backend_from_a_users_module_gets_its_plan_in_every_worker_and_keeps_the_fast_path():
    # Issue 40: a backend of the user's own declares, in its one file, what the C path does for it
    # at a start's later forks (Backend.fast_fork): those forks stay on the C path, and each worker
    # still gets the plan made in the parent, with its own ForkContext.
    for start in _starts("backend", starts=2):
        assert start["python_path"] == [0], start["python_path"]
        _check_items(start)
        for item in start["items"]:
            received = item["user_backend"]
            assert len(received) == 1, item  # its after_in_child ran once in this worker
            (got,) = received
            assert got["ctx_worker"] == item["worker"], item
            assert got["plan"] == {"parent": got["parent"], "worker_at_plan": 0}, item  # the first fork's plan


def test_a_users_own_per_fork_hook_runs_at_every_fork():
    # The C path stands in only for safeloader's own per-fork hooks: with one of the user's
    # registered, every fork takes the Python path, and the hook runs at each.
    for start in _starts("hook", starts=2):
        assert start["python_path"] == [0, 1, 2, 3], start["python_path"]
        _check_items(start)
