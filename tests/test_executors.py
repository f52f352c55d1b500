"""The "executors" backend: a ThreadPoolExecutor held by the Dataset works in forked workers."""

from __future__ import annotations

import pytest

from .subproc import check_script, run_script

pytestmark = pytest.mark.timeout(90)

# Each worker's items: index * 10 + how many threads its executor has (1: the worker started its own).
ITEMS = "[(1, 'ThreadPoolExecutor-0'), (11, 'ThreadPoolExecutor-0'), (21, 'ThreadPoolExecutor-0'), " \
    "(31, 'ThreadPoolExecutor-0'), (41, 'ThreadPoolExecutor-0'), (51, 'ThreadPoolExecutor-0')]"


@pytest.mark.torch_baseline
def test_torch_worker_waits_forever_on_the_parents_executor():
    # The executor counts the parent's thread as idle and starts none in the worker.
    result = run_script("executor_in_dataset.py", "torch", timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


def test_each_worker_starts_its_own_threads_and_the_parents_executor_still_works():
    lines = check_script("executor_in_dataset.py", "safeloader", timeout=60).stdout.splitlines()
    assert lines == [ITEMS, "PARENT 7 1"], lines


@pytest.mark.torch_baseline
def test_torch_worker_waits_forever_on_the_parents_thread_pool():
    # multiprocessing.pool.ThreadPool: the worker's copy has the parent's task queue and no thread.
    result = run_script("thread_pool_in_a_global.py", "torch", timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


def test_a_thread_pool_in_a_global_gets_its_own_threads_in_each_worker_and_still_works_in_the_parent():
    lines = check_script("thread_pool_in_a_global.py", "safeloader", timeout=60).stdout.splitlines()
    items = str([index * 10 + 3 for index in range(6)])
    assert lines == [items, items, "PARENT 7 2"], lines
