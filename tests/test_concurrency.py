"""Never worse than torch under concurrency and odd inputs: several threads, raising hooks, bad values."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

import safeloader
from safeloader import DataLoader, RegistrationError

from .subproc import check_script, run_python, run_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(240)]



# Each thread's Dataset loads a shared library in the worker (dlopen takes
# glibc's loader lock): a worker forked while another thread held that lock
# in safeloader's `before` hooks hung there (children/many_threads.py).
# Repeated: the hang showed in about half the runs.
def test_loaders_started_from_eight_threads_at_once_never_freeze_their_workers():
    result = check_script("many_threads.py", 6, "safeloader", timeout=180)
    assert result.stdout.count(" ok") == 6


@pytest.mark.torch_baseline
def test_torch_baseline_eight_threads_complete():
    # Warmed up first: unwarmed, torch's own workers hung here once on CI (no round done in
    # 120 s): a thread's first import dlopened an extension while another thread forked, and
    # the worker's dlopen waited on the loader lock that thread held in the parent. safeloader
    # waits for that lock before forking (test_stall_causes), and runs unwarmed above.
    result = check_script("many_threads.py", 2, "torch", "warm", timeout=120)
    assert result.stdout.count(" ok") == 2


def test_a_hook_walking_the_loaded_libraries_in_before_does_not_freeze_other_threads_workers():
    # What forkstate's snapshot does (dl_iterate_phdr with a Python callback, GIL released):
    # a user hook doing the same is covered by the fork guard too.
    result = check_script("many_threads.py", 4, "safeloader", "walker", timeout=180)
    assert result.stdout.count(" ok") == 4


def test_one_loader_iterated_from_four_threads_keeps_its_attributes_and_its_watchdog():
    result = check_script("same_loader_from_threads.py", timeout=150)
    assert "stall reported: WorkerStallError" in result.stdout, result


@pytest.mark.parametrize("exception", ["SystemExit", "KeyboardInterrupt"])
@pytest.mark.parametrize("phase", ["before", "after_in_parent"])
def test_base_exception_in_a_parent_hook_reaches_the_user_and_later_hooks_still_run(phase, exception, tmp_path):
    ran = tmp_path / "ran"

    def raising():
        raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[exception]()

    def later():
        ran.write_text("yes")

    # after_* run in hooks() order, `before` in the reverse: place `later` after `raising` in each.
    after_raising, after_later = ((), ("raising",)) if phase != "before" else (("later",), ())
    safeloader.register_at_fork(**{phase: raising}, name="raising", runs_after=after_raising)
    safeloader.register_at_fork(**{phase: later}, name="later", runs_after=after_later)
    # As itself, not a HookError: code catching KeyboardInterrupt (to save a checkpoint) must see it.
    with pytest.raises({"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[exception]):
        list(DataLoader(list(range(4)), num_workers=1))
    assert ran.read_text() == "yes"


def test_system_exit_in_a_worker_hook_reaches_the_parent_as_a_hook_error(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 64)
    result = check_script("worker_hook_system_exit.py", path, timeout=60)
    expected = "fork hook 'raising' failed in phase 'after_in_child' in DataLoader worker 0: SystemExit: 3"
    assert expected in result.stdout, result


# Issue 42, item 8: a hook's own `raise KeyboardInterrupt` in a worker was taken for Ctrl-C, so
# the worker ended quietly and the user read torch's "worker exited unexpectedly", naming no
# hook. Now it is a HookError like SystemExit's and RuntimeError's. torch beside: the same raise
# in its worker_init_fn (the nearest torch has) gives "exited unexpectedly" for KeyboardInterrupt
# and SystemExit. Ctrl-C reaching the worker (SIGINT) still stops it as it stops torch's.
@pytest.mark.parametrize("what", ["KeyboardInterrupt", "SystemExit", "RuntimeError", "SIGINT"])
def test_what_a_worker_hook_raises_reaches_the_parent_as_a_hook_error_and_ctrl_c_as_torchs(what):
    torch_result = check_script("worker_hook_raises.py", what, "torch", timeout=60).stdout.strip()
    result = check_script("worker_hook_raises.py", what, "safeloader", timeout=60).stdout.strip()
    if what == "SIGINT":
        assert torch_result.startswith("RuntimeError: DataLoader worker (pid(s)"), torch_result
        assert result.startswith("RuntimeError: DataLoader worker (pid(s)") and "exited unexpectedly" in result, result
        return
    hook_error = f"fork hook 'raising' failed in phase 'after_in_child' in DataLoader worker 0: {what}: 3"
    assert result.startswith("HookError: ") and result.endswith(hook_error), result
    if what == "RuntimeError":
        assert torch_result == "RuntimeError: Caught RuntimeError in DataLoader worker process 0.", torch_result
    else:
        assert torch_result.startswith("RuntimeError: DataLoader worker (pid(s)"), torch_result
        assert torch_result.endswith("exited unexpectedly"), torch_result


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("stall_timeout", float("nan"), "stall_timeout must be None (off) or a finite number"),
        ("stall_timeout", float("inf"), "stall_timeout must be None (off) or a finite number"),
        ("thread_budget", 10**9, "thread_budget must be None or an int from 1 to 1024"),
        ("disable_hooks", [["files"]], "disable_hooks must be an iterable of hook names (str)"),
        # Accepted before (10**400 > 0 and < inf), then the first iteration failed converting it to a
        # float: "OverflowError: int too large to convert to float", naming no option.
        pytest.param(
            "stall_timeout", 10**400, "stall_timeout must be None (off) or a finite number of seconds > 0, "
            "got an int of about 401 digits: too large (at most 9223372036)", id="stall_timeout-10**400",
        ),
        pytest.param(
            "stall_timeout", 10**5000, "stall_timeout must be None (off) or a finite number of seconds > 0, "
            "got an int of about 5001 digits: too large", id="stall_timeout-10**5000",  # repr() itself raises
        ),
        ("stall_timeout", 1e10, "stall_timeout must be None (off) or a finite number of seconds > 0, "
         "got 10000000000.0: too large (at most 9223372036)"),
        pytest.param(  # the message itself raised (repr of an int over 4300 digits), naming no option
            "thread_budget", 10**5000, "thread_budget must be None or an int from 1 to 1024, got an int of about "
            "5001 digits", id="thread_budget-10**5000",
        ),
    ],
)
def test_bad_option_values_are_refused_where_given(keyword, value, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        DataLoader(list(range(4)), num_workers=1, **{keyword: value})
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        safeloader.configure(**{keyword: value})


@pytest.mark.parametrize("kind", ["list", "generator", "iter", "map", "filter"])
def test_disable_hooks_read_once_disables_the_hook_at_every_start(kind, tmp_path):
    # A one-shot iterable was validated (read) when the loader was built and read again, empty, at
    # each start: the "disabled" hook ran in every worker (4 of 4 here).
    ran = tmp_path / "ran"

    def record() -> None:
        with open(ran, "a") as f:
            f.write("ran\n")

    safeloader.register_at_fork(after_in_child=record, name="t.record")
    names = ["t.record"]
    given = {
        "list": lambda: list(names),
        "generator": lambda: (name for name in names),
        "iter": lambda: iter(names),
        "map": lambda: map(str, names),
        "filter": lambda: filter(None, names),
    }[kind]()
    loader = DataLoader(list(range(4)), num_workers=2, disable_hooks=given)
    assert loader.disable_hooks == ("t.record",)  # kept as read, for trainers rebuilding the loader
    for _epoch in range(2):
        assert [int(x) for x in loader] == [0, 1, 2, 3]
    assert not ran.exists(), f"the disabled hook ran in {len(ran.read_text().split())} worker(s)"
    # The same names from the process-wide defaults.
    previous = safeloader.configure(disable_hooks=iter(names))
    try:
        assert [int(x) for x in DataLoader(list(range(4)), num_workers=2)] == [0, 1, 2, 3]
    finally:
        safeloader.configure(disable_hooks=previous.disable_hooks)
    assert not ran.exists()


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("every_fork", "no", "every_fork must be a bool, got 'no'"),
        ("requires", 5, "requires must be a module name or an iterable of module names, got 5"),
        ("replace", 1, "replace must be a bool, got 1"),
    ],
)
def test_bad_registration_arguments_are_refused_when_registering(keyword, value, message):
    with pytest.raises(RegistrationError, match=message):
        safeloader.register_at_fork(after_in_child=lambda: None, name="bad", **{keyword: value})
    assert "bad" not in {hook.name for hook in safeloader.hooks()}


# A batch the worker's result queue cannot send (here: pickling fails with EMFILE in
# the queue's feeder thread, as when tensors' descriptors run out) is printed by
# multiprocessing and dropped: torch's loader then waits forever (children/lost_batch.py).
@pytest.mark.torch_baseline
def test_torch_waits_forever_for_a_batch_its_worker_could_not_send():
    result = run_script("lost_batch.py", "torch", timeout=20, expect_hang=True)
    assert result.timed_out, result


def test_a_batch_the_worker_could_not_send_raises_naming_ulimit():
    result = check_script("lost_batch.py", "safeloader", timeout=60)
    assert "RAISED WorkerStallError" in result.stdout, result
    assert "could not send a batch" in result.stdout and "ulimit -n" in result.stdout, result


def _near_limit(loader: str, spare: int) -> str:
    result = run_python(
        f"import runpy, sys; sys.argv = ['x', {loader!r}, '{spare}']; "
        "runpy.run_module('tests.near_fd_limit', run_name='__main__')",
        timeout=60,
        cwd=REPO,
    )
    assert not result.timed_out, f"hung with {spare} spare descriptors:\n{result}"
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else str(result)


def test_near_the_open_file_limit_safeloader_works_wherever_torch_does_and_never_hangs():
    # The fewest spare descriptors torch's loader works with, found by bisection (each probe is a
    # fresh interpreter); torch fails with 12.
    low, high = 12, 40
    assert not _near_limit("torch", low).startswith("OK")
    assert _near_limit("torch", high).startswith("OK"), "torch never succeeded"
    while high - low > 1:
        middle = (low + high) // 2
        if _near_limit("torch", middle).startswith("OK"):
            high = middle
        else:
            low = middle
    # Where torch fails: a clear error (or a working loader), never a hang.
    for spare in (12, low):
        result = _near_limit("safeloader", spare)
        assert result.startswith("OK") or "ulimit -n" in result, f"{spare} spare descriptors: {result}"
    # Descriptors in flight vary by one from run to run; before this fix safeloader needed 3 more than torch.
    results = [_near_limit("safeloader", n) for n in (high, high + 1)]
    assert any(r.startswith("OK") for r in results), f"torch works with {high} spare descriptors: {results}"


def test_sigterm_leaves_nothing_of_safeloader_in_the_temp_directory():
    # A short TMPDIR: multiprocessing's Unix sockets live there, and their paths must fit in 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="sl", dir="/tmp"))
    try:
        result = run_script("sigterm_with_workers.py", timeout=60, env={"TMPDIR": str(temp)})
        assert not result.timed_out and result.returncode == -15, result
        assert [p.name for p in temp.iterdir() if p.name.startswith("safeloader")] == []
    finally:
        shutil.rmtree(temp, ignore_errors=True)


# A thread is inside an import when a worker forks; the worker imports the same module
# (children/import_in_another_thread.py). The worker inherits the module half-imported,
# its import lock held by a thread it does not have.
@pytest.mark.torch_baseline
def test_torch_worker_hangs_importing_a_module_another_thread_was_importing_at_the_fork(tmp_path):
    assert run_script("import_in_another_thread.py", "torch", tmp_path, timeout=15, expect_hang=True).timed_out


def test_safeloader_worker_imports_afresh_a_module_another_thread_was_importing_at_the_fork(tmp_path):
    result = check_script("import_in_another_thread.py", "safeloader", tmp_path, timeout=60)
    assert result.stdout.strip() == "[7, 8]"


def test_an_import_in_another_thread_is_not_waited_for_and_the_workers_import_it_afresh(tmp_path):
    # Two workers, one warning naming the importing thread: the forks do not wait for the import (each
    # waited up to 5 s before issue 42, item 3), as torch's do not. Each worker imports the module
    # itself instead of waiting forever on the parent thread's lock (torch hangs there:
    # test_torch_worker_hangs_importing_a_module_another_thread_was_importing_at_the_fork).
    result = check_script("import_outlasts_the_wait.py", tmp_path, timeout=60)
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "still importing once forked: True", result.stdout
    assert lines[1] == str([f"{i} imported in its worker" for i in range(4)]), result.stdout
    warned = [line for line in lines[2:] if "very_slow_to_import" in line]
    assert len(warned) == 1, result.stdout
    assert warned[0].startswith("RuntimeWarning: safeloader: another thread has been importing very_slow_to_import")
    assert "thread 'importer'" in warned[0], warned


# Issue 42, item 3: a warm-up thread imports a 40-module package (0.3 s a module, 12 s in all) while
# the main thread runs 3 epochs whose workers never need it (children/import_warmup_thread.py).
# Each fork waited up to 5 s for the import in flight, and again for each new submodule: the 3
# epochs took 12.9 s here (17-22 s in the issue) and outlasted the warm-up, torch's 1.3 s.
def test_epochs_beside_a_thread_importing_a_large_package_do_not_wait_for_it(tmp_path):
    runs = {}
    for loader in ("torch", "safeloader"):
        (tmp_path / loader).mkdir()
        runs[loader] = check_script("import_warmup_thread.py", loader, tmp_path / loader, timeout=60).stdout
    warnings = {}
    for loader, out in runs.items():
        lines = out.splitlines()
        assert lines[:2] == ["still importing after 3 epochs: True", str([[0, 1, 2, 3]] * 3)], (loader, out)
        # Python 3.12+ warns at each fork of a process with threads: not the warnings looked at here.
        warnings[loader] = [line for line in lines[2:] if "is multi-threaded, use of fork()" not in line]
    assert warnings["torch"] == [], runs["torch"]
    # Named once, by its thread and the package it asked for (not a submodule as if it were stuck).
    warned = warnings["safeloader"]
    assert len(warned) == 1 and "importing warm_package when" in warned[0], warned
    assert "thread 'warm-up'" in warned[0], warned
