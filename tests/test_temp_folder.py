"""A test session leaves the temporary folder as it found it (conftest.py's session folder)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from .subproc import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SESSION = """
import sys
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-n", "2", "tests/session_temp_folder_cases.py"]))
"""


# The test harness's own folder handling, not the library: make test-latest skips it (tooling).
@pytest.mark.tooling
@pytest.mark.timeout(150)
def test_a_test_session_with_workers_leaves_the_temporary_folder_as_it_found_it():
    tmpdir = tempfile.mkdtemp(prefix="s")  # short: the session's sockets live under it
    try:
        result = run_python(SESSION, timeout=140, env={"TMPDIR": tmpdir}, cwd=ROOT)
        assert not result.timed_out and result.returncode == 0, str(result)
        assert "2 passed" in result.stdout, str(result)
        assert os.listdir(tmpdir) == [], str(result)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
