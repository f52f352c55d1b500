"""The "blosc2" backend: arrays a Dataset reads with blosc2's threads, used in the parent, work in forked workers.

blosc2 compresses and decompresses on C-Blosc2 thread pools (blosc2.set_nthreads, and each
array's own cparams/dparams: by default as many threads as cores). Torch's forked workers
inherit the parent's pools without their threads and wait forever; safeloader stops the pools
around each fork and gives each worker its own.
"""

from __future__ import annotations

import ast

import pytest

from .subproc import check_script, run_script

pytestmark = pytest.mark.timeout(90)

pytest.importorskip("blosc2")

from safeloader.backends.blosc2 import resets_pools_in_child  # noqa: E402


def _read(out: str) -> tuple[list[list[tuple]], list[tuple], list[str], list[str], str]:
    """(each epoch's items, the parent's own reads, the warnings, the parent's state, workers left)."""
    lines = out.splitlines()
    epochs = [ast.literal_eval(line) for line in lines if line.startswith("[(")]
    expected = ast.literal_eval(next(line for line in lines if line.startswith("EXPECTED "))[9:])
    warned = [line for line in lines if "Warning:" in line]
    parent = next(line for line in lines if line.startswith("PARENT ")).split()[1:]
    left = next(line for line in lines if line.startswith("LEFT "))
    return epochs, expected, warned, parent, left


RESETS_ITS_POOLS = resets_pools_in_child()


@pytest.mark.torch_baseline
@pytest.mark.skipif(RESETS_ITS_POOLS, reason="this C-Blosc2 resets its pools in a forked child: the test below")
def test_torch_workers_wait_forever_on_the_parents_blosc2_pools():
    result = run_script("blosc2_in_dataset.py", "torch", "default", timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


@pytest.mark.skipif(not RESETS_ITS_POOLS, reason="this C-Blosc2 hangs a forked worker: the test above")
def test_torch_workers_read_with_their_own_pools_where_c_blosc2_resets_them_in_the_child():
    # The claim the backend acts on (it then neither waits for nor refuses the parent's cached pools):
    # wrong, torch's workers would wait forever here, as with C-Blosc2 3.3.
    epochs, expected, _, _, left = _read(
        check_script("blosc2_in_dataset.py", "torch", "default", timeout=60).stdout
    )
    assert len(epochs) == 1 and [item[:2] for item in epochs[0]] == expected, (epochs, expected)
    assert all(forked and threads == 2 for _, _, forked, threads, _ in epochs[0]), epochs
    assert left == "LEFT 0", left


def test_default_fork_workers_read_what_the_parent_reads_and_the_parent_keeps_its_pools():
    epochs, expected, warned, parent, left = _read(
        check_script("blosc2_in_dataset.py", "safeloader", "default", timeout=60).stdout
    )
    assert len(epochs) == 1 and [item[:2] for item in epochs[0]] == expected, (epochs, expected)
    # Forked by this process (no forkserver switch), within the default budget (2 cores // 2 workers: 1 on 2 cores).
    assert all(forked for _, _, forked, _, _ in epochs[0]), epochs
    assert not warned, warned  # no UnsafeForkWarning: blosc2's threads are handled
    # The parent's array still reads; its contexts, the global context and blosc2's pool are as before.
    assert parent == ["True", "2", "2", "2", "2", "2", "2"], parent
    assert left == "LEFT 0", left


def test_workers_with_two_threads_start_their_own_pools_for_two_epochs_even_for_an_array_held_elsewhere():
    # thread_budget=2: the workers' contexts use 2 threads, as the parent's did: pools of their own (a
    # pool the parent had left registered would hang them). The Dataset also reads a module global,
    # whose contexts hold the parent's pool too: found by the scan of the heap.
    epochs, expected, warned, parent, left = _read(
        check_script("blosc2_in_dataset.py", "safeloader", "budget2", timeout=60).stdout
    )
    assert len(epochs) == 2 and all([item[:2] for item in epoch] == expected for epoch in epochs), (epochs, expected)
    assert all(forked and threads == 2 and default == 2 for _, _, forked, threads, default in epochs[0]), epochs
    assert not warned, warned
    assert parent == ["True", "2", "2", "2", "2", "2", "2"], parent
    assert left == "LEFT 0", left
