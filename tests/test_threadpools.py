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
from safeloader.backends import threadpools

from .subproc import check_python, run_python

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(120)]

CORES = available_cores()

# Shared by the child scripts: an OpenMP parallel region at libgomp's default
# thread count, as a C extension built with -fopenmp runs it (torch's own ops
# use torch's count instead), and the pool counts threadpoolctl reports.
PRELUDE = """
import ctypes, json, os, sys, time
import numpy, threadpoolctl, torch
from torch.utils.data import Dataset
import safeloader

_gomp = ctypes.CDLL(os.path.join(torch.__path__[0], "lib", "libgomp.so.1"))
_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

def openmp_team_size():
    sizes = []
    body = _REGION(lambda _: sizes.append(_gomp.omp_get_num_threads()))
    _gomp.GOMP_parallel(body, None, 0, 0)  # 0 threads: the default (ICV) count
    return max(sizes)

def pools():
    return {i["internal_api"]: i["num_threads"] for i in threadpoolctl.threadpool_info()}

class Report(Dataset):
    '''Each item: the worker's pool counts, after running OpenMP code both ways.'''
    def __len__(self):
        return 4
    def __getitem__(self, index):
        team = openmp_team_size()
        total = float((torch.ones(1500, 1500) * 2).sum())  # torch's own parallel region
        return json.dumps({"pools": pools(), "torch": torch.get_num_threads(), "team": team, "total": total})

def settle():
    # Threads of the previous loader (queue feeders) may still be exiting: a thread the
    # fork-time record cannot attribute makes the backend assume OpenMP is live (1 thread).
    deadline = time.monotonic() + 10
    while safeloader.native.thread_census().foreign and time.monotonic() < deadline:
        time.sleep(0.05)

def run(loader):
    settle()
    iterator = iter(loader)
    try:
        return [json.loads(item) for item in iterator]
    finally:
        iterator._shutdown_workers()  # at once, also after a worker error
"""


@pytest.fixture(scope="module")
def fresh_parent() -> dict:
    """Loaders started from a parent that never ran an OpenMP parallel region."""
    code = PRELUDE + """
out = {"parent_before": pools(), "torch_before": torch.get_num_threads()}
out["default"] = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2))
out["per_loader"] = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2, thread_budget=2))
previous = safeloader.configure(thread_budget=2)
out["configured"] = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2))
safeloader.configure(thread_budget=previous.thread_budget)
out["disabled"] = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2,
                                            disable_hooks={"threadpools"}))
out["torch"] = run(torch.utils.data.DataLoader(Report(), batch_size=None, num_workers=2))
out["parent_after"] = pools()
out["torch_after"] = torch.get_num_threads()
print(json.dumps(out))
"""
    result = check_python(code, timeout=90)
    return json.loads(result.stdout.splitlines()[-1])


def test_default_budget_is_cores_divided_by_workers(fresh_parent):
    budget = max(1, CORES // 2)
    for item in fresh_parent["default"]:
        assert item["pools"]["openblas"] == budget
        assert item["pools"]["openmp"] == budget
        assert item["team"] == budget
        assert item["torch"] == budget


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


OPENMP_PARENT = PRELUDE + """
torch.set_num_threads(2)
parent_team = openmp_team_size()
(torch.ones(3000, 3000) * 3).sum()  # a torch op on a large tensor with 2 threads
assert parent_team == 2, parent_team
"""


def test_parent_openmp_region_then_budgeted_workers_do_not_hang():
    code = OPENMP_PARENT + """
before = pools()
items = run(safeloader.DataLoader(Report(), batch_size=None, num_workers=2, thread_budget=2))
print(json.dumps({"items": items, "before": before, "after": pools()}))
"""
    out = json.loads(check_python(code, timeout=60).stdout.splitlines()[-1])
    for item in out["items"]:
        assert item["pools"]["openmp"] == 1 and item["team"] == 1 and item["torch"] == 1  # pinned: no hang
        assert item["pools"]["openblas"] == 2  # BLAS still gets the budget
    assert out["after"] == out["before"]


@pytest.mark.torch_baseline
def test_same_budget_applied_naively_hangs_torch_loader():
    # The failure the pinning avoids: the same budget of 2 given to OpenMP in
    # torch's worker (via threadpoolctl) hangs at the first parallel region.
    code = OPENMP_PARENT + """
def naive_budget(worker_id):
    threadpoolctl.threadpool_limits(2)
run(torch.utils.data.DataLoader(Report(), batch_size=None, num_workers=2, worker_init_fn=naive_budget))
print("finished")
"""
    result = run_python(code, timeout=12)
    assert result.timed_out, f"expected torch's loader to hang:\n{result}"


def test_raising_torch_threads_in_a_pinned_worker_raises_instead_of_hanging():
    code = OPENMP_PARENT + """
def more_threads(worker_id):
    torch.set_num_threads(2)
try:
    run(safeloader.DataLoader(Report(), batch_size=None, num_workers=1, worker_init_fn=more_threads))
except RuntimeError as exc:
    print(json.dumps(str(exc)))
else:
    print(json.dumps("no error"))
"""
    message = json.loads(check_python(code, timeout=60).stdout.splitlines()[-1])
    assert "torch.set_num_threads(2) in DataLoader worker 0 would hang" in message
    assert "persistent_workers=True" in message


@pytest.mark.torch_baseline
def test_raising_torch_threads_in_torch_loader_hangs():
    code = OPENMP_PARENT + """
run(torch.utils.data.DataLoader(Report(), batch_size=None, num_workers=1,
                                worker_init_fn=lambda worker_id: torch.set_num_threads(2)))
print("finished")
"""
    result = run_python(code, timeout=12)
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
    assert len(list(loader)) == 2
    assert forkstate._recorded is not None  # a record was taken
    gone = weakref.ref(loader)
    del loader
    gc.collect()
    assert gone() is None
