"""A native thread pool no backend knows: never a silent hang (issue: any native pool, not a list).

The pool is tests/native/tiny_pool.c, built here with the system C compiler: threads waiting on a
condition variable for tasks, as in DuckDB, blosc2 or FFmpeg. The parent starts and uses it; a
forked worker has its state but not its threads, and its first task waits forever under torch's
loader. safeloader finds the live threads at the loader's start (attributed to the library they
wait in) and, by default, starts the workers with a forkserver when the Dataset pickles, or raises
before any worker starts when it does not.
"""

from __future__ import annotations

import json
import re

import pytest

import safeloader

from .subproc import check_python, check_script, run_script

pytestmark = pytest.mark.timeout(120)

SQUARES = "[0, 1, 4, 9, 16, 25]"


@pytest.mark.torch_baseline
def test_torch_worker_hangs_in_a_pool_the_parent_started(tiny_pool):
    result = run_script("unknown_native_pool.py", tiny_pool, "torch", "default", "pickles", timeout=60,
                        expect_hang=True)
    assert result.timed_out and result.stdout == "", result


def test_by_default_a_pickling_dataset_gets_forkserver_workers_and_correct_data(tiny_pool):
    out = check_script("unknown_native_pool.py", tiny_pool, "safeloader", "default", "pickles", timeout=90).stdout
    lines = out.splitlines()
    assert lines[0] == SQUARES, out
    assert lines[1].startswith("UnsafeForkWarning: safeloader: DataLoader workers would be forked from a process "
                               "holding libtinypool.so's native threads (2 live threads)"), out
    assert "start with a preloaded forkserver instead" in lines[1] and len(lines) == 2, out


def test_a_backend_that_declares_the_library_makes_its_threads_handled_and_workers_fork(tiny_pool):
    # The same unpicklable Dataset as below, with a third-party backend that resets the pool in
    # each worker and names the library (Backend.libraries): plain fork workers, no warning, right data.
    out = check_script("unknown_native_pool.py", tiny_pool, "safeloader", "backend", "unpicklable", timeout=60).stdout
    assert out.splitlines() == [SQUARES], out


def test_by_default_an_unpicklable_dataset_raises_before_any_worker_starts(tiny_pool):
    out = check_script("unknown_native_pool.py", tiny_pool, "safeloader", "default", "unpicklable", timeout=60).stdout
    assert out.startswith("UnsafeForkError: safeloader: DataLoader workers would be forked from a process holding "
                          "libtinypool.so's native threads (2 live threads)"), out
    assert "the Dataset does not pickle (TypeError: cannot pickle '_thread.lock' object)" in out, out
    assert "lazily (in __getitem__ or worker_init_fn)" in out and "on_unsafe_fork='ignore'" in out, out
    # A pool of its own that safeloader does not know may cope with fork (onnxruntime's intra-op
    # pool does, its inter-op pool does not): the error says so, and how to go on where it does.
    assert "a worker that uses it may wait forever: safeloader does not know whether" in out, out
    assert "'ignore' if the workers never use it or you checked that libtinypool.so works in forked workers" in out


def test_raise_policy_raises_even_when_the_dataset_pickles(tiny_pool):
    out = check_script("unknown_native_pool.py", tiny_pool, "safeloader", "raise", "pickles", timeout=60).stdout
    assert out.startswith("UnsafeForkError:") and "The workers were not started." in out, out


@pytest.mark.parametrize("policy", ["ignore", "warn", "missed"])
def test_forked_anyway_a_worker_waiting_for_the_pool_is_named_within_seconds(tiny_pool, policy):
    # "missed": default policy, but the pool's threads were not found at the start (on a loaded
    # machine they can still be running then): the watchdog looks again once a worker is slow.
    # The user forked anyway: the worker hangs as torch's does, and the watchdog names it long before
    # its 120 s first-item limit (stall_timeout 60): it waits, unchanged and using no CPU, in a library
    # whose threads the parent had at the fork.
    out = check_script("unknown_native_pool.py", tiny_pool, "safeloader", policy, "pickles", timeout=90).stdout
    assert re.match(r"WorkerStallError: safeloader: [12] DataLoader worker\(s\) stalled \(stall_timeout=60", out), out
    assert "and never will: it waits, unchanged and idle, inside a library whose threads" in out, out
    assert "Likely cause: libtinypool.so's native threads, inherited without them" in out, out
    # The native frame it waits in (the C extension's stack dumper; a run without it: SAFELOADER_REQUIRE_NATIVE=0).
    assert "pool_square" in out if safeloader.NATIVE else "Native stacks unavailable" in out, out
    waited = float(re.search(r"made no progress for ([0-9.]+) s", out).group(1))
    assert waited < 10, out
    assert ("UnsafeForkWarning" in out) == (policy == "warn"), out


WITHOUT_EXTENSION = {"SAFELOADER_DISABLE_NATIVE": "1", "SAFELOADER_REQUIRE_NATIVE": "0"}


def test_without_the_extension_a_worker_waiting_for_the_pool_is_named_all_the_same(tiny_pool):
    # No native stack dumper without the C extension: the library is the one the watchdog saw the
    # worker's main thread wait in (its stack read through /proc). Before: "a lock that is never released".
    out = check_script("unknown_native_pool.py", tiny_pool, "safeloader", "ignore", "pickles", timeout=90,
                       env=WITHOUT_EXTENSION).stdout
    assert "and never will: it waits, unchanged and idle, inside a library whose threads" in out, out
    assert "Likely cause: libtinypool.so's native threads, inherited without them" in out, out
    assert "Native stacks unavailable" in out, out


UNGUARDED = """
import ctypes, sys, torch, safeloader
lib = ctypes.CDLL(sys.argv[1]); lib.pool_start(2); lib.pool_square(3)

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 6
    def __getitem__(self, index):
        return ctypes.CDLL(sys.argv[1]).pool_square(index)

try:
    list(safeloader.DataLoader(Squares(), batch_size=None, num_workers=2))
except safeloader.UnsafeForkError as exc:
    print(exc)
"""


@pytest.mark.parametrize("main", ["script", "python -c"])
def test_by_default_a_main_module_forkserver_cannot_run_again_raises(tiny_pool, tmp_path, main):
    # Forkserver workers run the main script again: without a __main__ guard it would start its
    # loaders there; a main module with no file cannot be run again at all.
    if main == "script":
        script = tmp_path / "unguarded.py"
        script.write_text(UNGUARDED)
        out = check_script(script, tiny_pool, timeout=60).stdout
        assert 'the main script unguarded.py has no `if __name__ == "__main__":` guard' in out, out
    else:
        out = check_python(UNGUARDED.replace("sys.argv[1]", repr(str(tiny_pool))), timeout=60).stdout
        assert "the Dataset uses code defined in a main module that has no file" in out, out
    assert out.startswith("safeloader: DataLoader workers would be forked from a process holding libtinypool.so")


def test_a_library_known_to_survive_fork_only_from_a_release_on_is_judged_by_the_installed_one():
    from safeloader.diagnostics import native_libraries
    from safeloader.diagnostics.native_libraries import SURVIVES, Known

    assert Known(("numpy",), SURVIVES, "", since="1.0").applies("numpy")
    assert not Known(("numpy",), SURVIVES, "", since="999.1").applies("numpy")
    assert not Known(("x",), SURVIVES, "", since="1.0").applies("no-such-distribution")
    assert native_libraries._numbers("2.0.1rc1") == (2, 0, 1)


@pytest.mark.parametrize("build", ["extension", "fallback"])
def test_doctor_tells_an_unknown_pool_from_one_that_survives_fork(tiny_pool, build):
    # Without the C extension (no native stacks) each thread is named by where it started (its stack
    # read through /proc); before, by where it waited: "libc.so.6".
    out = check_python(
        f"""
import ctypes, json
lib = ctypes.CDLL({str(tiny_pool)!r}); lib.pool_start(2); lib.pool_square(2)
from tokenizers import Tokenizer, models
Tokenizer(models.WordLevel({{"a": 0, "[UNK]": 1}}, unk_token="[UNK]")).encode_batch(["a a"] * 5000)
import safeloader
live = safeloader.doctor(file=None)["live_at_fork"]
print(json.dumps({{h["subject"]: [h["status"], h["safeloader_will"]] for h in live}}))
""",
        timeout=60,
        env=WITHOUT_EXTENSION if build == "fallback" else None,
    ).stdout
    live = json.loads(out)
    assert live["libtinypool.so"][0] == "unknown", live
    assert "with on_unsafe_fork='auto' a loader starts its workers with a forkserver" in live["libtinypool.so"][1]
    tokenizers = next(key for key in live if key.startswith("tokenizers"))
    assert live[tokenizers] == ["harmless", "turns its parallelism off in a forked child (and says so once)"], live


def test_a_pool_started_after_a_loader_start_is_found_at_the_next_start(tiny_pool):
    # What a start finds is kept for the next while nothing it depends on changed: here the
    # library is loaded before the first start, and only its threads are new at the second.
    out = check_python(
        f"""
        import ctypes
        import time
        import torch
        import safeloader
        from safeloader.diagnostics.thread_owners import live_libraries

        lib = ctypes.CDLL({str(tiny_pool)!r})
        loader = safeloader.DataLoader(list(range(4)), batch_size=None, num_workers=2, on_unsafe_fork="raise")
        print(sorted(int(x) for x in loader))
        print(sorted(int(x) for x in loader))  # kept: the same threads
        lib.pool_start(2)
        assert lib.pool_square(3) == 9
        # Until both threads wait in the library: one just created may still be starting (a loaded
        # machine runs it late), and is then not attributed at the start (asked again at the next).
        deadline = time.monotonic() + 10
        while sum(n for path, n in live_libraries().items() if "libtinypool" in path) < 2:
            assert time.monotonic() < deadline, live_libraries()
            time.sleep(0.01)
        try:
            list(loader)
        except safeloader.UnsafeForkError as exc:
            print("UnsafeForkError:", exc)
        """,
        timeout=60,
    ).stdout
    lines = out.splitlines()
    assert lines[:2] == ["[0, 1, 2, 3]", "[0, 1, 2, 3]"], out
    assert lines[2].startswith("UnsafeForkError: safeloader: DataLoader workers would be forked from a process "
                               "holding libtinypool.so's native threads (2 live threads)"), out


@pytest.mark.parametrize("claim", ["claimed", "survives"])
def test_a_pool_the_table_wrongly_calls_safe_is_named_within_seconds_by_default(tiny_pool, claim):
    # Detection after the fork never trusts the table (issue 39, item 1). "claimed": a backend declares
    # the library (Backend.libraries) and leaves its pool as it is, as a thread limit the library itself
    # undoes on its next call; "survives": a table row says it survives fork. Either way the default
    # loader forks without a word, and the worker waits forever in the pool, as torch's does
    # (test_torch_worker_hangs_in_a_pool_the_parent_started, the same Dataset). Before: named only at
    # the first item's limit, 120 s. Every thread of the worker waits in a futex, none uses CPU.
    result = check_script("unknown_native_pool.py", tiny_pool, "safeloader", claim, "pickles", timeout=90)
    out = result.stdout
    assert out.startswith("WorkerStallError: safeloader:"), out
    assert "UnsafeForkWarning" not in out, out  # the table was believed at the start
    assert "and never will: it waits, unchanged and idle, inside a library whose threads" in out, out
    assert "Likely cause: libtinypool.so's native threads, inherited without them" in out, out
    assert "on_unsafe_fork='forkserver'" in out and "please report" not in out, out
    assert "pool_square" in out if safeloader.NATIVE else "Native stacks unavailable" in out, out
    waited = float(re.search(r"made no progress for ([0-9.]+) s", out).group(1))
    assert waited < 10, out
    # From the loader's creation to the error: well before the 120 s first-item limit (loaded CI machines).
    assert float(re.search(r"error after ([0-9.]+) s", result.stderr).group(1)) < 60, result.stderr


@pytest.mark.torch_baseline
def test_torch_worker_spins_on_a_zmq_socket_made_in_the_parent():
    # 20 s: as long as safeloader may take to name the same worker (the bound below).
    result = run_script("spinning_worker.py", "torch", "zmq", timeout=20, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


def test_a_worker_spinning_on_a_zmq_socket_made_in_the_parent_is_named_with_its_library_within_seconds():
    # Issue 39, item 2: pyzmq retries the EINTR every call on the parent's context returns in a forked
    # worker, using CPU and finishing no item. Before: named at the first item's limit (120 s) as
    # "unknown". The library is read from the worker's stacks, sampled while it runs: native stacks
    # (one signal each, sent only while the thread is out of any system call), Python frames read
    # from outside. faulthandler's signal, which the samples used to send too, could abort the worker
    # (libzmq's "Assertion failed: errno == EAGAIN": the handler left errno 0) or crash it (a frame
    # walked while being pushed): torch's "killed by signal" instead of this report.
    result = check_script("spinning_worker.py", "safeloader", "zmq", timeout=60)
    out = result.stdout
    assert out.startswith("WorkerStallError: safeloader:"), out
    assert "and never will: it keeps running, in a loop inside pyzmq's native code" in out, out
    assert "Likely cause: pyzmq's native state, inherited without its threads" in out, out
    assert "zmq/backend/cython/_zmq" in out and "on_unsafe_fork='forkserver'" in out, out
    # Named at its first sampling, when due: ORPHAN_WAIT + ORPHAN_CONFIRM = 5 s after the item began
    # (5.0-5.4 s in 24 runs at load 4-16; 5.0-8.3 s in 10 at load 14-27, where the parent itself waits
    # for a CPU; before: 5.0-11.1 s, up to a poll interval late, and a missed first sampling cost 4 s
    # more). A second sampling starts 9 s after the item began at the earliest: this bound fails it.
    waited = float(re.search(r"made no progress for ([0-9.]+) s", out).group(1))
    assert waited < 9, out
    # From the loader's creation to the error: the worker's start, the 5 s, the sampling (0.3-1 s, up
    # to 5 s where the machine runs the worker a tenth of the time: each sample waits for it to run)
    # and the report. Measured 6.3-8.3 s at load 6-16, 6.5-11.9 s at load 14-27 (before: 7.2-13.6 s in
    # runs interleaved with the first ones; 13-57 s on CI at load 12-16).
    assert float(re.search(r"error after ([0-9.]+) s", result.stderr).group(1)) < 20, result.stderr


def test_slow_numpy_items_calling_back_into_python_are_not_taken_for_a_spin():
    # 8 s items at full CPU in numpy, half of it in np.vectorize (numpy's C code calling the user's Python
    # function: the same shape as a retry loop), the parent's BLAS threads live: never reported
    # (stall_timeout=30: a first-item limit of 60 s), every item read.
    result = check_script("spinning_worker.py", "safeloader", "numpy", timeout=120)
    assert result.stdout.splitlines() == ["[0.0, 1.0]"], result
    # The path this test names ran: the workers were sampled with numpy's OpenBLAS live in the parent
    # (before, OpenBLAS's fork handler had stopped its threads and nothing was live: no sampling at
    # all), samples found numpy's C code calling back into the interpreter, and no spin was named.
    # Without spinning_in's check of the Python frames (the user's function called back), the same run
    # ends in "WorkerStallError: ... in a loop inside numpy's native code" after 5 s.
    counts = json.loads(re.search(r"^samplings: (.*)$", result.stderr, re.M).group(1))
    assert counts["samplings"] >= 1 and counts["numpy_callbacks"] >= 1 and counts["spins"] == 0, result.stderr
