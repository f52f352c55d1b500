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
