"""Hangs torch leaves silent: a parent thread inside glibc's dynamic loader while workers
fork (safeloader waits for it and forks healthy workers), and GNU OpenMP used with more than
one thread after the parent ran a parallel region (with safeloader's threadpools backend
disabled, the stall report names it and the disabled backend), a parent thread drawing random numbers
while workers fork (safeloader makes torch's generator lock new in the worker).
Each runs in a child under a deadline; torch's own loader is shown to hang on the same code."""

from __future__ import annotations

import pytest

from .subproc import run_script

pytestmark = pytest.mark.timeout(200)

# A parent thread sits inside dl_iterate_phdr (glibc's loader lock held; its
# callback sleeps) while the workers fork: a worker's dlopen waits forever
# (children/loader_lock_at_fork.py). A fresh program's hang: forked from the suite's warm
# interpreter (tests/warm_interpreter.py), whose torch import already did what the worker's
# dlopen waits on here, torch's worker does not hang.
@pytest.mark.torch_baseline
@pytest.mark.fresh_interpreter
def test_torch_hangs_when_a_parent_thread_holds_the_loader_lock_at_fork():
    assert run_script("loader_lock_at_fork.py", "torch", timeout=15, expect_hang=True).timed_out


@pytest.mark.fresh_interpreter
def test_safeloader_forks_after_a_parent_thread_releases_the_loader_lock():
    # safeloader's worker start itself needs the loader lock (its fork-time snapshot walks the
    # loaded libraries), so it waits for the other thread and forks a healthy worker.
    result = run_script("loader_lock_at_fork.py", "safeloader", timeout=60)
    assert not result.timed_out and "STALL" not in result.stdout, result
    assert "[tensor([0]), tensor([1]), tensor([2]), tensor([3])]" in result.stdout, result


# torch's bundled GNU OpenMP: the parent runs a parallel region, a worker raises its
# thread count and runs one (children/openmp_after_parent_region.py). safeloader's threadpools
# backend would release the parent's pool before the fork (tests/test_openmp_release.py).
@pytest.mark.torch_baseline
def test_torch_hangs_on_gnu_openmp_after_the_parent_ran_a_parallel_region():
    assert run_script("openmp_after_parent_region.py", "torch", timeout=15, expect_hang=True).timed_out


def test_a_gnu_openmp_hang_names_the_disabled_threadpools_backend():
    result = run_script("openmp_after_parent_region.py", "safeloader", timeout=60)
    assert not result.timed_out and "STALL" in result.stdout, result
    assert "GNU OpenMP (libgomp)" in result.stdout, result
    assert "safeloader's 'threadpools' backend is disabled for this loader" in result.stdout, result
    assert "no 'openmp' backend" not in result.stdout


# Another parent thread is inside a CPU random op (torch's default generator's lock held, the GIL
# released) while the loader forks: torch's worker waits forever in its first torch.manual_seed.
# Seen on CI as loaders started from eight threads (one thread's seed draw, another's fork).
@pytest.mark.torch_baseline
def test_torch_hangs_when_a_parent_thread_draws_random_numbers_at_fork():
    assert run_script("generator_lock_at_fork.py", "torch", timeout=30, expect_hang=True).timed_out


def test_safeloader_workers_seed_and_draw_while_a_parent_thread_draws_random_numbers():
    result = run_script("generator_lock_at_fork.py", "safeloader", timeout=90)
    assert not result.timed_out and result.returncode == 0, result
    assert result.stdout.splitlines() == ["[0, 1, 2, 3] True", "done"], result


# Seen with a parent thread drawing np.random.* while a loader started: torch's worker loop seeds numpy.
@pytest.mark.torch_baseline
def test_torch_hangs_when_a_parent_thread_draws_from_numpys_global_generator_at_fork():
    assert run_script("numpy_random_lock_at_fork.py", "torch", timeout=30, expect_hang=True).timed_out


def test_safeloader_workers_seed_and_draw_while_a_parent_thread_draws_from_numpys_global_generator():
    result = run_script("numpy_random_lock_at_fork.py", "safeloader", timeout=90)
    assert not result.timed_out and result.returncode == 0, result
    assert result.stdout.splitlines() == ["[0, 1, 2, 3] True True", "done"], result


def test_with_the_torch_backend_disabled_the_stall_report_names_numpys_generator_lock():
    result = run_script("numpy_random_lock_at_fork.py", "torch-off", timeout=90)
    assert not result.timed_out and "STALL" in result.stdout, result
    assert "numpy's global random generator lock" in result.stdout, result
    assert "safeloader's 'torch' backend is disabled for this loader" in result.stdout, result


def test_with_the_torch_backend_disabled_the_stall_report_names_the_generator_lock():
    result = run_script("generator_lock_at_fork.py", "torch-off", timeout=90)
    assert not result.timed_out and "STALL" in result.stdout, result
    assert "torch's random generator lock" in result.stdout, result
    assert "safeloader's 'torch' backend is disabled for this loader" in result.stdout, result


def test_a_worker_waiting_for_a_lock_of_the_c_librarys_own_is_told_as_such():
    # Seen in CI (2026-11-27, Python 3.13, loaders started from eight threads at once): a worker's
    # torch.set_num_threads registered a C++ static's destructor (__cxa_atexit) and waited forever for
    # glibc's exit-handler lock, which another thread of the parent held at the fork. The report's
    # stacks, as collected then; the cause was "unknown" before.
    from types import SimpleNamespace

    from safeloader.diagnostics.stacks import NativeThread, PythonThread
    from safeloader.diagnostics.stall_report import StallReport, likely_cause

    worker_loop = ".venv-latest/lib/python3.13/site-packages/torch/utils/data/_utils/worker.py"
    main = NativeThread(25269, "pt_data_worker", "futex_do_wait", [
        ("libc.so.6", "__lll_lock_wait_private+0x24"),
        ("libc.so.6", "?0x3deed"),
        ("torch/lib/libtorch_cpu.so", "?0x4fc3c58"),
        ("torch/lib/libtorch_cpu.so", "_ZN2at15set_num_threadsEi+0x2a"),
        ("libpython3.13.so.1.0", "PyObject_Vectorcall+0x4f"),
    ])
    report = StallReport(
        worker_id=1, pid=25269, waited=80.4, limit=80.0, starting=True, items_done=0,
        python_threads=[PythonThread(0x7F00, True, [(worker_loop, 274, "_worker_loop")])],
        python_text="", native_threads=[main], native_available=True,
    )
    watch = SimpleNamespace(stall_timeout=40.0, first_limit=80.0, disabled_hooks=frozenset(),
                            parent_threads=("Thread-1 (run)", "Thread-2 (run)"))
    cause = likely_cause(report, watch)
    assert cause.startswith("a lock of the C library's own"), cause
    assert "__lll_lock_wait_private" in cause and "Thread-1 (run), Thread-2 (run)" in cause
    assert "multiprocessing_context='forkserver'" in cause


def test_a_stack_dump_whose_worker_is_gone_reads_as_empty_not_as_an_error(tmp_path):
    # A worker may exit or be killed between two reads of its stack dump (/proc/<pid>/fd/<n>): CI saw
    # pyzmq's spinning worker end while its stacks were sampled, and the user got FileNotFoundError
    # instead of the stall report. What is gone reads as nothing dumped.
    from safeloader.diagnostics import stacks

    dump = tmp_path / "dump"
    dump.write_text("Thread 0x1 (most recent call first):\n")
    assert stacks.read_from(str(dump), 7) == "0x1 (most recent call first):\n"
    dump.unlink()
    assert stacks.read_from(str(dump), 0) == ""
    assert stacks.wait_for_dump(str(dump), 0, deadline=0.0) == ""
