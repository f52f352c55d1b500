"""``safeloader doctor``: run in a child interpreter, its report checked."""

from __future__ import annotations

import json
import sys

import pytest

from .subproc import check_python, check_script, run_python

pytestmark = pytest.mark.timeout(120)

def test_doctor_names_zarrs_pool_as_live_after_a_parent_decode():
    result = check_script("doctor_after_zarrs_decode.py", timeout=90)
    out = result.stdout
    assert "zarrs' rayon pool is live" in out, out
    line = next(i for i, text in enumerate(out.splitlines()) if "zarrs' rayon pool is live" in text)
    # ... and says what safeloader does about it: the zarrs backend, active.
    assert "fresh rayon pool" in out.splitlines()[line + 1], out
    assert "[on ] zarrs" in out and "Start method: workers will be started with 'fork'" in out, out
    for heading in ("Versions:", "Fork hooks and backends", "Live in this process and unsafe at fork:"):
        assert heading in out, out


def test_doctor_without_a_decode_sees_no_zarrs_pool():
    result = check_python("import zarrs, safeloader\nsafeloader.doctor()\n", timeout=90)
    assert "zarrs' rayon pool is live" not in result.stdout, result.stdout


def test_doctor_json_with_imports_lists_hooks_hazards_and_versions():
    result = run_python(
        "import sys; from safeloader.__main__ import main; sys.exit(main(['doctor', '--json', '--import', 'h5py']))",
        timeout=90,
    )
    assert result.returncode == 0, str(result)
    report = json.loads(result.stdout)
    assert report["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["start_method"]["safeloader"] == "fork"
    hooks = {hook["name"]: hook for hook in report["hooks"]}
    assert hooks["h5py"]["active"] is True  # --import h5py made it active
    assert "watchdog" in hooks
    assert isinstance(report["live_at_fork"], list)
    assert report["options"]["stall_timeout"] is not None


def test_doctor_reports_open_npz_and_h5py_handles_and_other_threads():
    assert check_script("doctor_open_handles.py", timeout=90).stdout.strip() == "ok"


def test_unknown_import_is_a_clear_error():
    result = run_python(
        "import sys; from safeloader.__main__ import main; sys.exit(main(['doctor', '--import', 'no_such_mod_x']))",
        timeout=60,
    )
    assert result.returncode == 2 and "no_such_mod_x" in result.stderr, str(result)
