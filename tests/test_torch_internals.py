"""safeloader names torch's private internals in one module, and never runs unarmed in silence."""

from __future__ import annotations

import pytest

from safeloader import _torch_internals

from .subproc import check_script

pytestmark = pytest.mark.timeout(120)


def test_this_torch_has_everything_safeloader_relies_on():
    assert _torch_internals.missing() == ()


def test_a_worker_loop_renamed_upstream_style_is_recognised():
    result = check_script("renamed_worker_loop.py", "_process_worker_loop", "safeloader", timeout=60)
    assert "DATA [0, 1, 2, 3, 4, 5]" in result.stdout and "HOOKS RAN 2" in result.stdout, result


def test_an_unknown_worker_loop_is_refused_instead_of_running_unarmed():
    # torch's own loader runs such a loop (no hook runs, nothing says so) ...
    torch_run = check_script("renamed_worker_loop.py", "_future_worker_loop", "torch", timeout=60)
    assert "DATA [0, 1, 2, 3, 4, 5]" in torch_run.stdout and "HOOKS RAN 0" in torch_run.stdout, torch_run
    # ... safeloader says it cannot protect these workers and stops them.
    result = check_script("renamed_worker_loop.py", "_future_worker_loop", "safeloader", timeout=60)
    assert "RAISED UnarmedWorkersError" in result.stdout and "none was recognised" in result.stdout, result
    assert "HOOKS RAN 0" in result.stdout


def test_thread_workers_are_told_that_fork_hooks_do_not_apply():
    result = check_script("thread_workers_warning.py", timeout=60)
    assert "thread workers" in result.stdout and "fork hooks and stall watchdog do not apply" in result.stdout
