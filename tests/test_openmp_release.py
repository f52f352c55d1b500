"""A GNU OpenMP runtime the parent used never hangs a worker, whichever library sets the thread count.

libgomp has no fork handler: a child forked after the parent ran a parallel region keeps the
forking thread's pool, counting threads it does not have, and its next region with more than one
thread waits for them for ever. A thread limit set once in the worker does not help against a
library that calls ``omp_set_num_threads`` itself on every call (LightGBM's predict with its
``num_threads``/``n_jobs``). safeloader releases the forking thread's pool in the parent just before
each worker fork (``omp_pause_resource_all``, through each loaded copy's own symbol): the worker has
no pool to wait on. Each case runs with torch's loader beside it (it hangs) and compares the
workers' results with the parent's, value for value.

The copies: the system's libgomp (LightGBM imported before torch: torch binds to it too, by its
soname), torch's bundled one (torch imported first), and a renamed bundled copy loaded before torch
next to torch's own (a copy of the system's with another soname, as wheels rename theirs; the
library using it is tests/native/omp_own_count.c).
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from .subproc import check_script, run_script

pytestmark = pytest.mark.timeout(180)

SOURCE = Path(__file__).parent / "native" / "omp_own_count.c"
SONAME = b"libgomp.so.1\x00"
RENAMED = b"libgomp-x.so\x00"  # the same length: the soname is rewritten in place


@pytest.fixture(scope="session")
def own_count_library(tmp_path_factory) -> Path:
    """tests/native/omp_own_count.c linked to a renamed copy of the system's GNU OpenMP runtime."""
    folder = tmp_path_factory.mktemp("renamed_gomp")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[:1]
    system_gomp = subprocess.run([*compiler, "-print-file-name=libgomp.so.1"], check=True, capture_output=True,
                                 text=True).stdout.strip()
    data = Path(os.path.realpath(system_gomp)).read_bytes()
    assert data.count(SONAME) == 1, "the soname string of the system's libgomp was not found once"
    (folder / RENAMED[:-1].decode()).write_bytes(data.replace(SONAME, RENAMED))
    objects = folder / "omp_own_count.o"
    subprocess.run([*compiler, "-fopenmp", "-fPIC", "-O1", "-c", "-o", str(objects), str(SOURCE)], check=True)
    library = folder / "libompowncount.so"
    subprocess.run([*compiler, "-shared", "-o", str(library), str(objects), f"-L{folder}",
                    f"-l:{RENAMED[:-1].decode()}", f"-Wl,-rpath,{folder}"], check=True)
    return library


def _run(loader: str, case: str, library: Path | str = "-", *flags: str) -> dict:
    result = check_script("openmp_own_count.py", loader, case, library, *flags, timeout=120)
    out = json.loads(result.stdout.splitlines()[-1])
    out["stderr"] = result.stderr
    return out


def _assert_workers_match_the_parent(out: dict) -> None:
    assert out["live"] == out["copies"], out["live"]  # each copy's pool threads were live in the parent
    assert out["got"] == out["expected"]  # value for value, in the loader's order
    assert out["after"] == out["expected"]  # the parent's own later regions (its threads started again)
    assert out["threads_after"] == out["threads_before"]  # the parent's OpenMP settings are kept


# LightGBM imported before torch: both use the system's libgomp; it must be a fresh interpreter
# (the tests' warm one has imported torch, and with it torch's copy).
@pytest.mark.fresh_interpreter
def test_lightgbm_imported_first_predicts_in_workers_what_the_parent_predicts():
    out = _run("safeloader", "lightgbm-first")
    assert [os.path.basename(path) for path in out["copies"]] == ["libgomp.so.1.0.0"]
    assert "torch" not in out["copies"][0]
    _assert_workers_match_the_parent(out)


@pytest.mark.torch_baseline
@pytest.mark.fresh_interpreter
def test_lightgbm_imported_first_hangs_torchs_workers():
    result = run_script("openmp_own_count.py", "torch", "lightgbm-first", "-", timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


def test_lightgbm_on_torchs_own_libgomp_predicts_in_workers_what_the_parent_predicts():
    out = _run("safeloader", "torch-first")
    assert len(out["copies"]) == 1 and f"{os.sep}torch{os.sep}" in out["copies"][0], out["copies"]
    _assert_workers_match_the_parent(out)


@pytest.mark.torch_baseline
def test_lightgbm_on_torchs_own_libgomp_hangs_torchs_workers():
    result = run_script("openmp_own_count.py", "torch", "torch-first", "-", timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


@pytest.mark.fresh_interpreter
def test_a_renamed_copy_loaded_before_torch_and_torchs_own_both_run_full_teams_in_workers(own_count_library):
    out = _run("safeloader", "renamed", own_count_library)
    names = sorted(os.path.basename(path) for path in out["copies"])
    assert names == ["libgomp-x.so", "libgomp.so.1"], out["copies"]  # two copies, each live in the parent
    _assert_workers_match_the_parent(out)
    for _total, team, torch_team, _sum in out["got"]:
        assert team == 4 and torch_team == 2  # the library's own count in its copy; torch's 2 in torch's


@pytest.mark.torch_baseline
@pytest.mark.fresh_interpreter
def test_a_renamed_copy_loaded_before_torch_hangs_torchs_workers(own_count_library):
    result = run_script("openmp_own_count.py", "torch", "renamed", own_count_library, timeout=60, expect_hang=True)
    assert result.timed_out and result.stdout == "", result


@pytest.mark.fresh_interpreter
def test_another_parent_thread_running_its_own_regions_through_the_forks_is_left_alone(own_count_library):
    # libgomp keeps a pool per thread that starts a region: only the forking thread's is released,
    # and another thread's regions go on in its own pool, with right results, while workers fork.
    out = _run("safeloader", "renamed", own_count_library, "busy")
    _assert_workers_match_the_parent(out)
    count, all_right = out["busy"]
    assert count > 0 and all_right, out["busy"]


@pytest.mark.fresh_interpreter
def test_a_loader_started_inside_a_parallel_region_keeps_that_copy_at_one_thread_and_says_so(own_count_library):
    # Inside a region of torch's copy its pool cannot be released (libgomp refuses): that copy stays
    # at 1 thread in the workers, with a warning; the library's own copy is released as ever.
    out = _run("safeloader", "renamed", own_count_library, "in-region")
    _assert_workers_match_the_parent(out)
    assert [team for _total, team in out["got"]] == [4] * 4
    warnings = [line for line in out["stderr"].splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1, out["stderr"]
    assert "the GNU OpenMP pool of libgomp.so.1 (" in warnings[0] and f"{os.sep}torch{os.sep}" in warnings[0]
    assert "the forking thread is inside an OpenMP parallel region" in warnings[0]
    assert "multiprocessing_context='forkserver'" in warnings[0]
