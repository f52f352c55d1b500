"""Libraries that terminate a forked child themselves once the parent used them (issue: any native
pool): numba's OpenMP threading layer and TensorStore. torch's loader loses its workers ("exited
unexpectedly" or "killed by signal", the library's own message on stderr); safeloader finds the library before any
worker starts and, the Dataset pickling, starts the workers with a forkserver: correct data and a
warning that names the library and its own fork-safe setting. numba's workqueue layer survives
fork: no warning there (a false alarm would be a defect too). Each case runs in a child
(tests/children/aborting_library.py) under a deadline.
"""

from __future__ import annotations

import pytest

from .subproc import check_python, check_script, run_script

pytestmark = pytest.mark.timeout(150)


@pytest.mark.torch_baseline
@pytest.mark.parametrize("case, message", [("numba", "Terminating: fork() called from a process already using GNU "
                                                      "OpenMP"), ("tensorstore", "fork")])
def test_torchs_workers_are_terminated_by_the_library(case, message):
    result = run_script("aborting_library.py", case, "torch", timeout=90)
    # torch says it either way, depending on which it notices first: its SIGCHLD handler or its queue's timeout.
    assert result.stdout.startswith("RuntimeError: DataLoader worker (pid"), result
    assert "exited unexpectedly" in result.stdout or "is killed by signal" in result.stdout, result
    assert message in result.stderr, result


@pytest.mark.parametrize("case, named", [
    ("numba", "numba's native threads (omppool."),
    ("tensorstore", "tensorstore's native threads (_tensorstore."),
])
def test_safeloader_names_the_library_and_starts_forkserver_workers_with_correct_data(case, named):
    lines = check_script("aborting_library.py", case, "safeloader", timeout=120).stdout.splitlines()
    assert lines[0] == "equal to the direct read", lines
    assert len(lines) == 2 and lines[1].startswith("UnsafeForkWarning: "), lines
    assert named in lines[1] and "is terminated by the library itself" in lines[1], lines
    assert "start with a preloaded forkserver instead" in lines[1], lines


def test_numba_remedy_is_named_and_its_workqueue_layer_forks_with_no_warning():
    numba = check_script("aborting_library.py", "numba", "safeloader", timeout=120).stdout
    assert "NUMBA_THREADING_LAYER='workqueue'" in numba
    assert check_script("aborting_library.py", "numba-workqueue", "safeloader", timeout=120).stdout.splitlines() == [
        "equal to the direct read"
    ]


@pytest.mark.parametrize("case, named", [
    ("numba", "numba's native threads (omppool."),
    ("tensorstore", "tensorstore's native threads (_tensorstore."),
    # torch's SIGCHLD handler raises the dead worker's error while its iterator is being built.
    ("tensorstore-at-start", "tensorstore's native threads (_tensorstore."),
])
def test_forked_anyway_the_dead_workers_error_names_the_library_and_the_remedies(case, named):
    # on_unsafe_fork="warn": the workers are forked and the library terminates them, as under torch;
    # torch's error then says which library the parent held and what to do.
    lines = check_script("aborting_library.py", case, "safeloader-warn", timeout=120).stdout.splitlines()
    assert lines[0].startswith("RuntimeError: DataLoader worker (pid"), lines
    assert f"safeloader: this loader forked its workers from a process holding {named}" in lines[0], lines
    assert "create or open what uses it in each worker, lazily" in lines[0], lines
    assert lines[1].startswith("UnsafeForkWarning: ") and "Forked anyway" in lines[1], lines


def test_doctor_names_numbas_openmp_layer_once_used_with_its_own_setting():
    out = check_python(
        """
        import numpy as np
        from numba import njit, prange

        @njit(parallel=True)
        def total(values):
            sum_ = 0.0
            for i in prange(values.shape[0]):
                sum_ += values[i]
            return sum_

        total(np.arange(1000.0))
        import safeloader
        safeloader.doctor()
        """,
        timeout=120,
    ).stdout
    assert "[WARN] numba (omppool." in out and "NUMBA_THREADING_LAYER='workqueue'" in out, out
    assert "1 problem(s): numba (omppool." in out, out
