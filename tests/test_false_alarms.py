"""Libraries that are fine under fork raise no alarm: live native threads are not a hazard by themselves."""

from __future__ import annotations

import pytest

from .subproc import check_script

pytestmark = pytest.mark.timeout(120)


def test_pools_that_survive_fork_or_have_a_backend_start_forked_workers_with_no_warning(tmp_path):
    out = check_script("fine_under_fork.py", tmp_path, timeout=90).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    live = set(eval(lines["LIVE"]))
    # Their threads were live at the start.
    assert {"tokenizers", "pyarrow", "polars", "numcodecs", "onnxruntime", "duckdb"} <= live, out
    assert lines["UNSAFE"] == "0", out
    items = eval(lines["ITEMS"])
    assert len(items) == 4 and all(forked for _, forked in items), out  # forked workers, not a forkserver
