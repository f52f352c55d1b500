"""The "threadpools" backend: BLAS/OpenMP pools in workers get the thread budget, never a hang.

Pool counts depend on what the parent did before forking (an OpenMP parallel
region leaves libgomp threads behind), so the loaders run in fresh
interpreters whose history the test controls.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

import safeloader
from safeloader import forkstate
from safeloader._options import available_cores
from safeloader.backends import _blas_pools, _openblas_count, _openblas_stop, threadpools

from .subproc import check_python, check_script, run_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(120)]

CORES = available_cores()

# The loaders run in child scripts, tests/children/threadpools_*.py; what they share (an OpenMP
# region at libgomp's default count, the pool counts, a reporting Dataset) is children/threadpool_report.py.

@pytest.fixture(scope="module")
def fresh_parent() -> dict:
    """Loaders started from a parent that never ran an OpenMP parallel region."""
    result = check_script("threadpools_fresh_parent.py", timeout=90)
    return json.loads(result.stdout.splitlines()[-1])


def test_default_budget_is_cores_divided_by_workers_and_torch_keeps_its_own_one_thread(fresh_parent):
    # By default torch's own threads (and its OpenMP runtime, shared here) stay at the 1 thread
    # torch's worker loop sets: more would start torch's thread pool in every worker at its start.
    budget = max(1, CORES // 2)
    for item in fresh_parent["default"]:
        assert item["pools"]["openblas"] == budget
        assert item["pools"]["openmp"] == 1
        assert item["team"] == 1
        assert item["torch"] == 1


def test_torch_default_leaves_openblas_at_every_core(fresh_parent):
    # What the backend fixes: torch limits only itself, so each of N workers runs N BLAS threads.
    for item in fresh_parent["torch"]:
        assert item["pools"]["openblas"] == fresh_parent["parent_before"]["openblas"] == CORES
        assert item["torch"] == 1
    for item in fresh_parent["disabled"]:
        assert item["pools"]["openblas"] == CORES


def test_per_loader_budget_overrides_the_default(fresh_parent):
    for item in fresh_parent["per_loader"]:
        assert item["pools"] == {"openblas": 2, "openmp": 2}
        assert item["team"] == 2 and item["torch"] == 2


def test_configured_budget_applies_to_every_loader(fresh_parent):
    for item in fresh_parent["configured"]:
        assert item["pools"] == {"openblas": 2, "openmp": 2}
        assert item["torch"] == 2


def test_parent_limits_are_unchanged(fresh_parent):
    assert fresh_parent["parent_after"] == fresh_parent["parent_before"]
    assert fresh_parent["torch_after"] == fresh_parent["torch_before"]


def test_results_match_a_direct_read(fresh_parent):
    expected = float(torch.ones(1500, 1500).mul(2).sum())
    for key in ("default", "per_loader", "configured", "disabled", "torch"):
        assert [item["total"] for item in fresh_parent[key]] == [expected] * 4


def test_a_budget_starts_no_blas_threads_in_a_worker_and_never_raises_a_pool():
    # OpenBLAS's setter starts its whole pool again in a forked worker (busy-waiting threads: 1.9x
    # torch's start with 16 cores). Lowered in place (its blas_cpu_number, private in the newest
    # builds: found in its symbol table), a worker has no thread but torch's own pool's; a budget
    # above the parent's count leaves the pool as the parent had it. Without either, a worker here
    # had 1 to 3 OpenBLAS threads more.
    report = json.loads(check_script("threadpools_no_restart.py", timeout=60).stdout.splitlines()[-1])
    parent = report["parent"]
    assert report["torch"] == [[1, parent, 1]] * 2  # torch's worker: one thread, the parent's count
    for name, budget in (("below", 1), ("above", parent + 2)):
        for threads, openblas, torch_threads in report[name]:
            assert openblas == min(budget, parent), (name, report)
            assert threads == torch_threads, (name, report)  # main + torch's own n - 1: no BLAS thread


def test_openblas_private_thread_count_is_found_in_its_getters_code():
    # OpenBLAS 0.3.34 (numpy 2.5) keeps blas_cpu_number private: it is found through the
    # getter's machine code, reading no file. Where a build exports it, the two agree.
    import ctypes

    import numpy  # noqa: F401  (loads its OpenBLAS)
    import threadpoolctl

    library = next(c for c in threadpoolctl.ThreadpoolController().lib_controllers if c.internal_api == "openblas")
    getter = library._get_symbol("openblas_get_num_threads")
    found = _openblas_count.private_cpu_number(getter)
    try:
        exported = ctypes.c_int.in_dll(library.dynlib, "blas_cpu_number")  # numpy 2.4's OpenBLAS (0.3.31)
    except ValueError:
        assert found is not None and found.value == getter()
        return
    assert found is None or ctypes.addressof(found) == ctypes.addressof(exported)


def test_parent_openmp_region_then_budgeted_workers_do_not_hang():
    # The parent's GNU OpenMP pool is released before each fork: workers run 2-thread regions.
    out = json.loads(check_script("threadpools_openmp_parent.py", "budgeted", timeout=60).stdout.splitlines()[-1])
    for item in out["items"]:
        assert item["pools"]["openmp"] == 2 and item["team"] == 2 and item["torch"] == 2  # the budget: no hang
        assert item["pools"]["openblas"] == 2  # BLAS gets the budget too
    assert out["after"] == out["before"]


def test_a_pool_that_cannot_be_released_keeps_budgeted_workers_at_one_openmp_thread_with_a_warning():
    # A libgomp without omp_pause_resource_all (older than GCC 9): its pool stays in the parent, so
    # the workers' OpenMP is pinned at 1 thread (more would hang), and the user is told.
    result = check_script("threadpools_openmp_parent.py", "budgeted", "no-pause", timeout=60)
    out = json.loads(result.stdout.splitlines()[-1])
    for item in out["items"]:
        assert item["pools"]["openmp"] == 1 and item["team"] == 1 and item["torch"] == 1  # pinned: no hang
        assert item["pools"]["openblas"] == 2  # BLAS still gets the budget
    assert out["after"] == out["before"]
    assert result.stderr.count("RuntimeWarning: safeloader: the GNU OpenMP pool of libgomp.so.1") == 1, result.stderr
    assert "has no omp_pause_resource_all (it is older than GCC 9)" in result.stderr, result.stderr
    assert "multiprocessing_context='forkserver'" in result.stderr, result.stderr


@pytest.mark.torch_baseline
def test_same_budget_applied_naively_hangs_torch_loader():
    # The failure the pinning avoids: the same budget of 2 given to OpenMP in
    # torch's worker (via threadpoolctl) hangs at the first parallel region.
    result = run_script("threadpools_openmp_parent.py", "naive-torch", timeout=12, expect_hang=True)
    assert result.timed_out, f"expected torch's loader to hang:\n{result}"


def test_raising_torch_threads_in_a_worker_works_once_the_parents_pool_is_released():
    result = check_script("threadpools_openmp_parent.py", "more-threads", timeout=60)
    assert json.loads(result.stdout.splitlines()[-1]) == "no error"


def test_raising_torch_threads_in_a_pinned_worker_raises_instead_of_hanging():
    result = check_script("threadpools_openmp_parent.py", "more-threads", "no-pause", timeout=60)
    message = json.loads(result.stdout.splitlines()[-1])
    assert "torch.set_num_threads(2) in DataLoader worker 0 would hang" in message
    assert "persistent_workers=True" in message


@pytest.mark.torch_baseline
def test_raising_torch_threads_in_torch_loader_hangs():
    result = run_script("threadpools_openmp_parent.py", "more-threads-torch", timeout=12, expect_hang=True)
    assert result.timed_out, f"expected torch's loader to hang:\n{result}"


# -- in-process ----------------------------------------------------------------


def test_forkstate_attributes_live_openmp_threads_to_libgomp():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.ones(3000, 3000) * 2).sum()
    finally:
        torch.set_num_threads(previous)
    gomp = os.path.realpath(os.path.join(torch.__path__[0], "lib", "libgomp.so.1"))
    deadline = time.monotonic() + 5
    state = forkstate.snapshot()
    while gomp not in state.gomp_live and time.monotonic() < deadline:
        time.sleep(0.05)  # pool threads spin briefly before they block
        state = forkstate.snapshot()
    assert gomp in state.gomp_live
    assert gomp in state.gomp_unsafe
    assert state.threads_in(gomp)
    assert {p.internal_api for p in state.pools} >= {"openblas", "openmp"}
    assert "GNU OpenMP" in state.describe()


def test_fresh_interpreter_has_no_live_openmp_threads():
    code = """
import json, numpy, torch
from safeloader import forkstate
state = forkstate.snapshot()
print(json.dumps([state.gomp_loaded, state.gomp_live, state.gomp_unsafe]))
"""
    loaded, live, unsafe = json.loads(check_python(code, timeout=60).stdout.splitlines()[-1])
    assert loaded and live == [] and unsafe == []


class ParentState(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int):
        state = forkstate.parent_state()
        return json.dumps(None if state is None else [state.pid, state.fork_generation])


def test_worker_sees_the_parent_state_recorded_at_its_fork():
    items = [json.loads(x) for x in safeloader.DataLoader(ParentState(), batch_size=None, num_workers=2)]
    generation = safeloader.native.fork_generation()
    assert items == [[os.getpid(), generation]] * 2
    assert forkstate.parent_state() is None  # the parent is not a worker


def test_without_threadpoolctl_the_backend_is_listed_inactive(monkeypatch):
    monkeypatch.setattr(threadpools, "_threadpoolctl_installed", lambda: False)
    monkeypatch.delitem(__import__("sys").modules, "threadpoolctl", raising=False)
    try:
        threadpools.BACKEND.register()
        hook = next(h for h in safeloader.hooks() if h.name == "threadpools")
        assert not hook.active
        assert threadpools.status().startswith("inactive: threadpoolctl is not installed")
    finally:
        monkeypatch.undo()
        threadpools.BACKEND.register()
    assert next(h for h in safeloader.hooks() if h.name == "threadpools").active


def test_thread_budget_must_be_a_positive_int():
    with pytest.raises(ValueError, match="thread_budget must be None or an int from 1 to 1024, got 0"):
        safeloader.DataLoader(ParentState(), num_workers=1, thread_budget=0)


def test_fork_records_do_not_keep_the_loader_alive():
    # The record is taken per fork; holding the fork's context (which holds the
    # loader) would keep a persistent loader and its workers alive forever.
    import gc
    import weakref

    loader = safeloader.DataLoader(ParentState(), batch_size=None, num_workers=2, persistent_workers=True)
    items = [json.loads(x) for x in loader]
    assert items == [[os.getpid(), safeloader.native.fork_generation()]] * 2  # each worker's fork was recorded
    gone = weakref.ref(loader)
    del loader
    gc.collect()
    assert gone() is None


def test_a_pool_started_between_two_forks_of_one_loader_is_seen_at_the_next_fork():
    # One loader's forks reuse the first fork's record of the parent's threads while the
    # threads are the same: an OpenMP pool started after worker 0's fork has new threads,
    # so worker 1 must be forked knowing it: the pool is released before its fork, and worker 1
    # runs its OpenMP region with its budget of 2 threads (with the pool kept, more than 1 hangs).
    result = check_script("openmp_between_forks.py", timeout=60)
    workers = json.loads(result.stdout.splitlines()[-1])
    assert workers == {"0": [False, 2], "1": [True, 2]}


def test_the_name_search_finds_exactly_the_objects_whose_file_name_holds_a_prefix():
    # named() searches all loaded paths at once for a few keys: each prefix must hold one of them.
    assert all(any(key in prefix for key in _blas_pools.KEYS) for prefix in _blas_pools.PREFIXES)
    paths = [
        "/venv/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so",
        "/venv/site-packages/torch/lib/libgomp.so.1",
        "/usr/lib/x86_64-linux-gnu/libBLAS.so.3",  # any case
        "/opt/intel/lib/libmkl_rt.so.2",
        "/opt/openblas/lib/libz.so.1",  # a prefix in a folder's name only
        "/venv/site-packages/compression/_zstd.so",  # "omp" in no prefix
        "/usr/lib/libc.so.6",
    ]
    assert _blas_pools.named(paths) == set(paths[:4])


@pytest.mark.parametrize("step", ["per path", "public"])
def test_the_backend_finds_every_pool_threadpoolctls_whole_scan_finds_a_linked_library_too(step):
    # The backend hands threadpoolctl only the loaded files whose name (or link target) it
    # could know, once per path: the pools must be the same as its scan of every library. The
    # per-path step is threadpoolctl's private one; without it ("public"), its public scan is asked.
    result = check_script("threadpools_linked_library.py", *(["public"] if step == "public" else []), timeout=60)
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["copy"] in report["whole"]
    assert report["found"] == report["whole"]


def test_without_threadpoolctl_a_live_openmp_pool_is_refused_with_the_command_that_installs_it():
    # A user's environment without the extra: the backend cannot limit GNU OpenMP in the workers,
    # and the refusal says why and how to get it (it said only "its backend 'threadpools' is off").
    code = """
import importlib.util

find_spec = importlib.util.find_spec  # threadpoolctl not found, as where it is not installed
importlib.util.find_spec = lambda name, *args: None if name == "threadpoolctl" else find_spec(name, *args)
import torch, safeloader
torch.set_num_threads(2)
torch.ones(2_000_000).sum()  # GNU OpenMP's pool live in the parent
try:
    print(list(safeloader.DataLoader(list(range(4)), num_workers=1, on_unsafe_fork="raise")))
except safeloader.UnsafeForkError as error:
    print(error)
"""
    out = check_python(code, timeout=60).stdout
    assert out.startswith("safeloader: DataLoader workers would be forked from a process holding GNU OpenMP"), out
    assert "its backend 'threadpools' is off: threadpoolctl is not installed" in out, out
    assert "(pip install torch-safeloader[threadpoolctl])" in out, out
    # What a forked worker suffers from GNU OpenMP is known: said as a fact, no "check it yourself".
    assert "a worker that uses it waits forever (torch's own loader hangs there too)" in out, out
    assert "you checked that" not in out, out


def test_each_private_pthreads_openblas_has_its_thread_shutdown_found_exported_or_in_its_symbol_table():
    # numpy 2.4's OpenBLAS exports blas_thread_shutdown_, numpy 2.5's keeps it private: either way it is
    # found (its address agreed on by two exported functions), and only for copies no native pool calls.
    import numpy  # noqa: F401  (loads its OpenBLAS)

    pools = [pool for pool in _blas_pools.PoolFinder().pools(forkstate.loaded_libraries()) if pool.pthreads_openblas]
    assert pools
    for pool in pools:
        assert pool.stop_servers is not None and pool.stop_servers.function() is not None, pool.path
    assert not _openblas_stop.private_copy("/venv/site-packages/torch.libs/libopenblasp-r0-1a2b3c4d.3.27.so")
    assert not _openblas_stop.private_copy("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
    assert _openblas_stop.symbol_values(__file__, ("blas_thread_shutdown_",)) == {}  # no ELF file
