"""Attributing a native thread to the library that started it, without /proc/self/maps on the way."""

from __future__ import annotations

import json
import os

import pytest

from .subproc import check_script

pytestmark = pytest.mark.timeout(60)


def test_threads_are_attributed_as_from_proc_self_maps_with_and_without_the_kernels_query():
    result = check_script("thread_owners_compare.py", timeout=45)
    report = json.loads(result.stdout)
    found = report["found"]
    assert any("openblas" in os.path.basename(path or "") for path in found.values()), report
    assert found == report["without_query"] == report["from_maps"], report
    assert all(path is None or os.path.realpath(path) == path for path in found.values()), report


@pytest.mark.parametrize("mode", ["stop", "wait", "thread"])
def test_a_start_right_after_a_blas_call_does_not_wait_for_openblas_spinning_threads(mode):
    # OpenBLAS's threads spin for work after a BLAS call; the check waited up to 50 ms for each new
    # one (at every start of a loop that calls BLAS between epochs). Its own fork handler stops them
    # at the fork: stopped just before the check instead, nothing is left to wait for. numpy 2.5's
    # OpenBLAS keeps that function private (found in its file's symbol table). Never while another
    # Python thread lives: it could be inside BLAS, waiting for the threads a stop would end.
    result = check_script("blas_before_start.py", mode, timeout=45)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["batches"] == [[0, 1, 2, 3], [4, 5, 6, 7]], report
    assert report["computes"], report
    assert report["running"] >= 1, report  # the scenario: a thread spinning at the start
    if mode == "stop":
        assert report["pauses"] == 0 and report["stopped"] >= 1, report
    else:
        assert report["pauses"] >= 1 and report["stopped"] == 0, report  # as before the change
