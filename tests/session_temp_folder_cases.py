"""Tests that write into the temporary folder as the suite's do, run by ``test_temp_folder.py`` as a
pytest session of their own (the name does not match ``test_*.py``: the suite does not collect them)."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.utils.data

from .conftest import SESSION_TMPDIR
from .subproc import run_python


@pytest.mark.timeout(60)
def test_a_loader_test_writes_data_and_its_workers_share_batches(tmp_path):
    assert tempfile.gettempdir() == os.environ[SESSION_TMPDIR]  # in every test process, xdist's workers too
    assert str(tmp_path).startswith(os.environ[SESSION_TMPDIR])
    tempfile.mkdtemp()  # a data folder a test forgets to remove
    batches = list(torch.utils.data.DataLoader(torch.arange(8.0), batch_size=2, num_workers=2))
    assert torch.cat(batches).tolist() == list(range(8))


@pytest.mark.timeout(60)
def test_a_child_killed_at_its_deadline_leaves_its_multiprocessing_folder():
    code = """
import multiprocessing.util, time
print(multiprocessing.util.get_temp_dir(), flush=True)  # a pymp-* folder, removed only at a clean exit
time.sleep(60)
"""
    result = run_python(code, timeout=4)
    assert result.timed_out, str(result)
    left = result.stdout.strip()
    assert os.path.dirname(left) == os.environ[SESSION_TMPDIR] and os.path.isdir(left), str(result)
