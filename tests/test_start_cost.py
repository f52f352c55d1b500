"""What a loader start costs is counted, not timed (timings live in benchmarks/bench_startup.py)."""

from __future__ import annotations

import json

from .subproc import check_script


def _start(mode: str) -> dict:
    return json.loads(check_script("start_opens.py", mode, timeout=90).stdout.splitlines()[-1])


def test_a_start_whose_native_threads_are_all_attributed_opens_no_library_file():
    # torch's OpenMP and numpy's OpenBLAS threads are live: each waits in a library safeloader
    # knows (a backend handles it), so the on_unsafe_fork check reads nothing from disk. The one
    # exception, once per process: the symbol table of an OpenBLAS whose spinning threads the start
    # stops, where its build keeps blas_thread_shutdown_ private (numpy 2.5); a later start reads none.
    found = _start("attributed")
    assert found["foreign"] >= 2, found  # the pools really are live
    assert set(found["opened"]) <= set(found["stoppable"]) and not found["warned"], found
    assert found["opened_again"] == [], found


def test_a_live_pool_no_backend_handles_is_read_and_named():
    # The same check still reads the one library whose live threads no active backend handles.
    found = _start("unhandled")
    read = [path.rsplit("/", 1)[-1] for path in found["opened"] if path not in found["stoppable"]]
    assert read == ["_polars_runtime.abi3.so"], found  # (OpenBLAS's symbol table: as above)
    assert found["warned"], found


def _worker_ran(mode: str) -> set[str]:
    return set(json.loads(check_script("worker_hook_code.py", mode, timeout=90).stdout.splitlines()[-1])["ran"])


def test_a_worker_runs_no_code_of_the_backends_whose_parent_found_nothing_for_it():
    # Each hook a worker runs costs it pages copied from its parent: a backend whose `before`
    # found nothing to hand over (Backend.NOTHING_TO_DO) runs nothing in the worker.
    ran = _worker_ran("nothing")
    assert not ran & {"files", "sockets", "executors", "lmdb", "h5py", "_reopen"}, ran
    assert {"torch_state", "gc_freeze"} <= ran, ran  # what every worker needs still runs
    held = _worker_ran("held")  # a read-only file and a TCP connection the Dataset holds: both hooks run
    assert {"files", "sockets", "_reopen"} <= held, held
    # A read-only file only the parent holds (a global the Dataset does not reach): left as torch leaves it.
    elsewhere = _worker_ran("elsewhere")
    assert not elsewhere & {"files", "_reopen"}, elsewhere
