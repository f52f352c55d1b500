"""``safeloader doctor`` names a native thread only by a name the thread gave itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(90)
def test_the_console_script_does_not_call_openblas_threads_named_after_it():
    # numpy's OpenBLAS starts its threads when numpy loads, unnamed: they carry the program's
    # name, here the console script's, "safeloader", which says nothing about them.
    script = os.path.join(os.path.dirname(sys.executable), "safeloader")
    python_path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "PYTHONPATH": python_path}  # 2: one OpenBLAS thread
    result = subprocess.run([script, "doctor"], capture_output=True, text=True, timeout=80, env=env)
    assert result.returncode == 0, result.stderr
    openblas = [line for line in result.stdout.splitlines() if "OpenBLAS: " in line and "native thread" in line]
    assert openblas, result.stdout
    assert all("named" not in line for line in openblas), openblas
