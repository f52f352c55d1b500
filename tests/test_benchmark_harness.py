"""The benchmark suite runs end to end on a tiny configuration (shape of its output, never timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .subproc import run_python

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent


def test_suite_runs_on_a_tiny_configuration_and_writes_json_table_and_chart(tmp_path):
    output = tmp_path / "suite.json"
    result = run_python(
        f"""
import sys
from benchmarks.__main__ import main
sys.exit(main(["--tiny", "--repeats", "1", "--only", "first batch, 1", "npz",
               "--output", {str(output)!r}]))
""",
        timeout=240,
        cwd=str(ROOT),
    )
    assert not result.timed_out and result.returncode == 0, str(result)
    data = json.loads(output.read_text())
    assert set(data) == {"machine", "config", "elapsed_s", "scenarios"}
    assert {"date", "cores", "platform", "versions"} <= set(data["machine"])
    assert data["machine"]["versions"]["torch"].startswith("2.")
    assert data["config"]["repeats"] == 1
    assert list(data["scenarios"]) == ["first batch, 1 worker", "npz opened in __init__"]
    for scenario, contenders in data["scenarios"].items():
        assert "safeloader" in contenders, scenario
        for name, entry in contenders.items():
            assert entry["status"] == "ok" or entry["status"].startswith(("hang", "error: ")), (name, entry)
            if entry["status"] == "ok":
                assert entry["n"] == 1 and entry["min"] <= entry["median"] <= entry["max"]
                assert isinstance(entry["correct"], bool)
        assert contenders["safeloader"]["status"] == "ok" and contenders["safeloader"]["correct"]
        assert contenders["safeloader"]["ratio_to_safeloader"] == pytest.approx(1.0)
    # The failure safeloader fixes is recorded as such, not waited out or dropped.
    assert data["scenarios"]["npz opened in __init__"]["spawn"]["status"].startswith("error: ")
    assert output.with_suffix(".png").stat().st_size > 1000
    assert "| **safeloader** |" in result.stdout
