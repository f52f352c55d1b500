"""polars in forked workers: torch's workers hang once the parent used polars' pool; safeloader's run it.

Each scenario runs in a child process under a deadline (tests/subproc.py):
tests/children/polars_scenario.py.
The parent runs a group_by on enough rows to start polars' rayon pool, as a
Dataset that prepares its data in ``__init__`` does.
"""

from __future__ import annotations

import json

import pytest

from .subproc import check_script, run_script

pytest.importorskip("polars")  # in the test extra; skipped only where the extra is not installed


@pytest.mark.torch_baseline
def test_torch_workers_hang_after_the_parent_used_polars(tmp_path):
    result = run_script("polars_scenario.py", "torch", tmp_path, timeout=25, expect_hang=True)
    assert result.timed_out, f"torch's workers were expected to hang on polars' inherited pool:\n{result}"


@pytest.mark.parametrize("dataset", ["Files", "Inherited"])
def test_safeloader_workers_run_polars_and_match_a_direct_read(tmp_path, dataset):
    assert "ok" in check_script("polars_scenario.py", "safeloader", tmp_path, dataset, timeout=90).stdout


def test_lazyframe_on_an_in_memory_frame_fails_at_once_naming_the_fix(tmp_path):
    assert "refused" in check_script("polars_scenario.py", "lazy", tmp_path, timeout=60).stdout


def test_parent_that_never_started_the_pool_keeps_the_inherited_module(tmp_path):
    assert check_script("polars_scenario.py", "never-started", timeout=60).stdout.strip() == "[2, 2]"


# "fallback": without the C extension's native stacks, the report reads what the worker's
# innermost stack points into through /proc.
@pytest.mark.parametrize("env", [{}, {"SAFELOADER_DISABLE_NATIVE": "1"}], ids=["extension", "fallback"])
def test_stall_report_names_polars_rayon_pool_when_the_backend_is_off(tmp_path, env):
    out = check_script("polars_scenario.py", "stall-report", tmp_path, timeout=90, env=env).stdout
    assert "polars' rayon pool, inherited without its threads" in out, out
    assert "_polars_runtime" in out and "disable_hooks" in out, out  # where it waits, and the fix


def test_doctor_names_polars_pools_and_whether_a_backend_resets_them():
    assert "ok" in check_script("polars_scenario.py", "doctor", timeout=60).stdout


def _unsafe_fork_run(tmp_path, timeout: float, **loader_options):
    """children/polars_scenario.py's unsafe-fork run: its Dataset is children/polars_files.py, a module
    of its own (forkserver workers import it); the 'polars' backend is off."""
    return check_script(
        "polars_scenario.py", "unsafe-fork", tmp_path / "data", json.dumps(loader_options), timeout=timeout
    )


def test_on_unsafe_fork_forkserver_starts_workers_that_run_a_pool_no_backend_resets(tmp_path):
    # The 'polars' backend is off: polars stands for any Rust library safeloader has no backend for.
    result = _unsafe_fork_run(tmp_path, timeout=120, on_unsafe_fork="forkserver")
    assert "NOT FORKED" in result.stdout and "WARNINGS []" in result.stdout, result


def test_default_starts_the_workers_with_a_forkserver_and_says_why(tmp_path):
    # The Dataset pickles: its workers get a fresh polars in a preloaded forkserver, and the user is told.
    out = _unsafe_fork_run(tmp_path, timeout=120).stdout
    warned = out.split("WARNINGS", 1)[1].replace("\\'", "'")  # printed as a list's repr
    assert "polars' rayon pool and tokio runtime" in warned and "preloaded forkserver instead" in warned, out
    assert "its backend 'polars' is off for this loader" in warned and "NOT FORKED" in out, out


def test_warn_policy_forks_warns_naming_the_library_and_the_watchdog_names_the_hang(tmp_path):
    # Forked anyway: its workers hang in polars' inherited pool, and the stall report says where.
    out = _unsafe_fork_run(tmp_path, timeout=60, stall_timeout=2, on_unsafe_fork="warn").stdout
    warned = out.split("WARNINGS", 1)[1].replace("\\'", "'")  # printed as a list's repr
    assert warned.count("UnsafeForkWarning") == 0 and "polars' rayon pool and tokio runtime" in warned, out
    assert "on_unsafe_fork='forkserver'" in warned, out
    assert "STALLED:" in out and "polars' rayon pool, inherited without its threads" in out, out
