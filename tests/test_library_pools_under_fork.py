"""Each library the fork-time check lets through (a "survives" row of
``safeloader.diagnostics.native_libraries``) and each it refuses (a "hangs" row), on the same code
under torch's own loader and under safeloader's (issue 39).

A case (tests/children/library_under_fork.py) drives the library's pool in the parent on more
than one thread (its threads that took CPU are counted: a small call that runs on the calling
thread alone proves nothing), then 2 forked workers run the same work for 4 items; every item
is compared with the parent's own result, value for value. A row that calls a library safe
when it is not fails here: torch's loader times out on that case, and safeloader's forks into
the same wait without a word.
"""

from __future__ import annotations

import json

import pytest

from safeloader.diagnostics import native_libraries

from .subproc import check_script

pytestmark = pytest.mark.timeout(150)

# Survives fork, and how: the pool threads that take CPU in a worker (> 0: the pool starts afresh
# there) or none (the library runs on the calling thread there: tokenizers and numcodecs turn
# their threads off in a forked child, OpenCV runs its loops serially there, onnxruntime's caller
# does what no pool thread took).
SURVIVES = {
    "tokenizers": False, "pyarrow": True, "numcodecs": False, "numexpr": True, "numba-workqueue": True,
    "onnxruntime": False, "duckdb-async-threads-0": False, "torch-intra-op": False, "opencv": False,
    "scipy-fft": True,
}
# Hangs under torch's loader: safeloader refuses before any worker starts, naming what it found.
HANGS = {
    "duckdb": ("duckdb's native threads", "SET async_threads=0"),
    "onnxruntime-parallel": ("ExecutionMode.ORT_PARALLEL", "ExecutionMode.ORT_SEQUENTIAL"),
    "torch": ("torch.jit.fork", "before the parent first uses torch's inter-op pool"),
}
# The "survives" rows and the case above that proves each; a row missing here fails the last test.
ROWS = {
    "tokenizers": "tokenizers", "pyarrow": "pyarrow", "numcodecs": "numcodecs", "numexpr": "numexpr",
    "workqueue": "numba-workqueue", "onnxruntime": "onnxruntime", "duckdb": "duckdb-async-threads-0",
    "libtorch": "torch-intra-op", "cv2": "opencv", "pypocketfft": "scipy-fft", "pyduccfft": "scipy-fft",
    # Proven elsewhere, for the usage they name: tests/test_ray_accelerate.py (Ray's threads live in
    # the Ray Train worker, DataLoader workers that do not call Ray read every shard); CUDA needs a
    # GPU (tests/test_torch_state.py: the worker's CUDA call gets torch's own error, not a wait).
    "ray": "tests/test_ray_accelerate.py", "libcuda": "no GPU here",
}


def cases(names) -> list:
    return sorted(names)


def run_case(case: str, loader: str, tmp_path) -> dict:
    out = check_script("library_under_fork.py", case, loader, tmp_path, timeout=120).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["parent_threads"] >= 1, (result, out)  # the parent's work used the library's pool threads
    return result


def assert_reads_like_the_parent(result: dict, restarts: bool) -> None:
    assert result["error"] == "" and result["warnings"] == [], result
    assert [value for value, _ in result["items"]] == result["expected"], result
    assert all(forked for _, forked in result["items"]), result  # plain fork workers, not a forkserver
    if restarts:
        assert all(threads >= 1 for threads in result["worker_threads"]), result
    else:
        assert result["worker_threads"] == [0, 0, 0, 0], result


@pytest.mark.torch_baseline
@pytest.mark.parametrize("case", cases(SURVIVES))
def test_torchs_loader_reads_what_the_parent_reads_after_the_parent_used_the_pool(case, tmp_path):
    assert_reads_like_the_parent(run_case(case, "torch", tmp_path), SURVIVES[case])


@pytest.mark.parametrize("case", cases(SURVIVES))
def test_safeloader_forks_with_no_warning_and_reads_what_the_parent_reads(case, tmp_path):
    # duckdb-async-threads-0: the remedy the refusal below names (SET async_threads=0 in the parent).
    assert_reads_like_the_parent(run_case(case, "safeloader", tmp_path), SURVIVES[case])


@pytest.mark.torch_baseline
@pytest.mark.parametrize("case", cases(HANGS))
def test_torchs_loader_hangs_after_the_parent_used_the_pool(case, tmp_path):
    result = run_case(case, "torch", tmp_path)
    assert result["items"] == [] and result["error"].startswith("RuntimeError: DataLoader timed out"), result


@pytest.mark.parametrize("case", cases(HANGS))
def test_safeloader_refuses_before_any_worker_starts_and_names_the_remedy(case, tmp_path):
    result = run_case(case, "safeloader", tmp_path)
    named, remedy = HANGS[case]
    assert result["items"] == [] and result["error"].startswith("UnsafeForkError: "), result
    assert "waits forever (torch's own loader hangs there too)" in result["error"], result
    assert named in result["error"] and remedy in result["error"], result


def test_every_survives_row_has_a_case_that_fails_if_it_is_wrong():
    rows = [entry for entry in native_libraries.KNOWN if entry.fork == native_libraries.SURVIVES]
    untested = [entry.names for entry in rows if not any(name in ROWS for name in entry.names)]
    assert untested == [], f"a 'survives' row with no case in tests/children/library_under_fork.py: {untested}"
