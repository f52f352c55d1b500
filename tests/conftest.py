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


# -- the order: each test process runs its share of the longest tests in its first half --------
# pytest-xdist's worksteal scheduler gives each worker a contiguous share of the collection (in
# collection order), and a worker that runs out takes the second half of the longest remaining
# queue (by count). A long test late in a share ran alone at the end of the session (Ray Train's,
# one to three minutes, is in the middle of the alphabet), with the other workers idle. The longest
# tests are dealt here over the shares, longest first, each to the share with the least so far,
# and spread over the first half of their share, so that they do not all start at once (a spike
# of load that a test with a time limit of its own feels); the others keep their order (one
# module's tests stay together: its module-scoped fixtures start once). Only the order changes.

LONGEST = {
    # Test (a node id, or a test function's for all its parameters) -> seconds it took in
    # `make test` (-n 6 on 2 cores, load about 20): roughly, they only order the tests.
    "tests/test_ray_accelerate.py::test_ray_train_hangs_without_install_and_every_rank_reads_its_shard_with_"
    "install_in_the_train_function": 190,
    "tests/test_trainers.py::test_loader_pickles_where_torch_does[spawn-context]": 100,
    "tests/test_benchmark_harness.py::test_suite_runs_on_a_tiny_configuration_and_writes_json_table_and_chart": 80,
    "tests/test_demo.py::test_demo_table_shows_safeloader_correct_for_every_format_and_leaves_no_file": 65,
    "tests/test_interrupts.py::test_every_start_after_an_interrupt_storm_works_and_no_worker_is_left": 55,
    "tests/test_interrupts.py::test_a_keyboard_interrupt_in_each_builtin_hooks_parent_phase_reaches_the_user_"
    "and_the_next_start_works": 55,
    "tests/test_h5py.py::test_same_dataset_works_under_forkserver_and_spawn": 55,
    "tests/test_temp_folder.py::test_a_test_session_with_workers_leaves_the_temporary_folder_as_it_found_it": 55,
    "tests/test_fsspec.py::test_s3_filesystem_made_in_init_works_in_4_workers": 50,
    "tests/test_loader_parity.py::test_explicit_spawn_context_is_respected": 50,
    "tests/test_watchdog.py::test_spawned_workers_are_watched_too": 50,
    "tests/test_lmdb.py::test_environment_is_reopened_in_spawn_workers_and_writable_ones_are_refused": 45,
    "tests/test_aborting_libraries.py::test_numba_remedy_is_named_and_its_workqueue_layer_forks_with_no_warning": 45,
    "tests/test_benchmark_harness.py::test_executors_scenario_reports_epoch_and_first_batch_side_by_side": 45,
    "tests/test_trainers.py::test_lightning_ddp_on_cpu_rebuilds_safe_loaders_with_distributed_sampler": 40,
    "tests/test_watchdog_false_positives.py::test_a_stopped_job_longer_than_stall_timeout_completes": 35,
    "tests/test_user_signals.py::test_a_user_sigcont_handler_installed_after_a_loader_causes_no_false_stall": 35,
    "tests/test_user_signals.py::test_a_seven_second_stop_with_a_user_sigcont_handler_is_not_a_stall": 35,
    "tests/test_openmp_release.py::test_lightgbm_imported_first_predicts_in_workers_what_the_parent_predicts": 35,
    "tests/test_openmp_release.py::test_lightgbm_imported_first_hangs_torchs_workers": 35,
    "tests/test_gc_freeze.py::test_worker_collection_copies_parent_objects_under_torch_loader": 30,
    "tests/test_fsspec.py::test_same_s3_dataset_under_torch_loader_fails": 30,
    "tests/test_openmp_release.py::test_a_renamed_copy_loaded_before_torch_and_torchs_own_both_run_full_teams_in_"
    "workers": 30,
    "tests/test_library_pools_under_fork.py::test_torchs_loader_hangs_after_the_parent_used_the_pool": 30,
    "tests/test_aborting_libraries.py::test_torchs_workers_are_terminated_by_the_library": 30,
    "tests/test_doctor_thread_names.py::test_the_console_script_does_not_call_openblas_threads_named_after_it": 30,
    "tests/test_ray_accelerate.py::test_accelerate_without_install_hangs_after_the_training_process_decoded": 25,
}


def _seconds(item: pytest.Item) -> float:
    return LONGEST.get(item.nodeid) or LONGEST.get(item.nodeid.split("[", 1)[0]) or 0.0


def _shares(count: int, workers: int) -> list[int]:
    """The sizes of the shares worksteal first sends the workers: each gets what is left over the
    workers left (xdist.scheduler.worksteal, check_schedule)."""
    sizes = []
    for left in range(workers, 0, -1):
        sizes.append((count - sum(sizes)) // left)
    return sizes


@pytest.hookimpl(trylast=True)  # after -m and -k deselected theirs: the shares are of what runs
def pytest_collection_modifyitems(config, items):
    workers = getattr(config, "workerinput", {}).get("workercount", 0)
    if workers < 2:  # not a pytest-xdist worker (its --dist is make test's worksteal)
        return
    sizes = _shares(len(items), workers)
    longest = sorted((item for item in items if _seconds(item)), key=_seconds, reverse=True)
    heads: list[list[pytest.Item]] = [[] for _ in sizes]
    load = [0.0] * len(sizes)
    for item in longest:  # each to the share with the least so far that has room
        share = min((i for i in range(len(sizes)) if len(heads[i]) < sizes[i]), key=lambda i: load[i])
        heads[share].append(item)
        load[share] += _seconds(item)
    chosen = {id(item) for item in longest}
    rest = iter([item for item in items if id(item) not in chosen])
    ordered = []
    for head, size in zip(heads, sizes):
        others = [next(rest) for _ in range(size - len(head))]
        gap = len(others) // 2 // max(1, len(head))  # the others between two long ones
        for i, item in enumerate(head):
            ordered += [item, *others[i * gap : (i + 1) * gap]]
        ordered += others[len(head) * gap :]
    assert len(ordered) == len(items)
    items[:] = ordered


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


@pytest.fixture(scope="session")
def tiny_pool(tmp_path_factory):
    """tests/native/tiny_pool.c built with the system C compiler: a native pool no backend knows."""
    import subprocess
    import sysconfig
    from pathlib import Path

    library = tmp_path_factory.mktemp("native") / "libtinypool.so"
    compiler = sysconfig.get_config_var("CC") or "cc"
    source = Path(__file__).parent / "native" / "tiny_pool.c"
    command = [*compiler.split()[:1], "-shared", "-fPIC", "-O1", "-pthread", "-o", str(library), str(source)]
    subprocess.run(command, check=True)
    return library
