"""``safeloader doctor``: run in a child interpreter, its report checked."""

from __future__ import annotations

import json
import platform
import sys

import pytest

import safeloader

from .subproc import check_python, check_script, run_python, run_script

pytestmark = pytest.mark.timeout(120)

HANDLED = "Handled at fork (the hook that handles each):"
BREAKS = "Will break in forked workers:"
NOTHING_TO_DO = "Nothing to do: everything live in this process is handled at fork (by the hook named for each)."


def _section(out: str, heading: str) -> list[str]:
    """The lines under ``heading`` up to the next blank line."""
    lines = out.splitlines()
    if heading not in lines:
        return []
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def _items(section: list[str]) -> list[tuple[str, str]]:
    """(item line, the line under it) for each ``[..]`` item of a section."""
    return [(line, section[i + 1]) for i, line in enumerate(section) if line.startswith("  [")]


def _check_handled_report(out: str, hook: str, subject: str) -> list[tuple[str, str]]:
    """No warning; ``subject`` is listed as handled by the hook ``hook``; every handled item names
    its hook; the last line says there is nothing to do."""
    assert "[WARN]" not in out and BREAKS not in out and "unsafe at fork" not in out, out
    handled = _items(_section(out, HANDLED))
    assert handled, out
    for item, by in handled:
        assert item.startswith("  [ok  ] "), out
        assert by.strip().startswith(("handled by: hook '", "handled by: zarr's own fork handler")), (item, by)
    assert any(subject in item and f"handled by: hook '{hook}'" in by for item, by in handled), out
    assert out.strip().splitlines()[-1] == NOTHING_TO_DO, out
    return handled


def test_doctor_names_zarrs_pool_as_live_after_a_parent_decode():
    result = check_script("doctor_after_zarrs_decode.py", timeout=90)
    out = result.stdout
    assert "zarrs' rayon pool: " in out, out
    line = next(i for i, text in enumerate(out.splitlines()) if "zarrs' rayon pool: " in text)
    # ... and says what safeloader does about it: the zarrs backend, active.
    assert "fresh rayon pool" in out.splitlines()[line + 1], out
    assert "[on ] zarrs" in out and "Start method: workers will be started with 'fork'" in out, out
    for heading in ("Versions:", "Fork hooks and backends", HANDLED):
        assert heading in out, out


def test_doctor_says_whether_workers_are_freed_of_glibcs_exit_handler_lock():
    code = "import safeloader\nsafeloader.doctor()\n"
    found = "exit-handler lock  found: each fork child releases it"
    if safeloader.NATIVE and platform.machine() == "x86_64":
        assert found in check_python(code, timeout=90).stdout
    missing = "exit-handler lock  not found: a worker forked while another thread registers an exit handler can hang"
    assert missing in check_python(code, timeout=90, env={"SAFELOADER_DISABLE_NATIVE": "1"}).stdout


def test_doctor_without_a_decode_sees_no_zarrs_pool():
    result = check_python("import zarrs, safeloader\nsafeloader.doctor()\n", timeout=90)
    assert "zarrs' rayon pool" not in result.stdout, result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("Nothing to do:"), result.stdout


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
    assert all(h["status"] in ("handled", "harmless", "breaks", "unknown") for h in report["live_at_fork"])
    assert isinstance(report["summary"], str) and report["summary"], report
    assert report["options"]["stall_timeout"] is not None


def test_doctor_reports_open_npz_and_h5py_handles_and_other_threads():
    assert check_script("doctor_open_handles.py", timeout=90).stdout.strip() == "ok"


def test_unknown_import_is_a_clear_error():
    result = run_python(
        "import sys; from safeloader.__main__ import main; sys.exit(main(['doctor', '--import', 'no_such_mod_x']))",
        timeout=60,
    )
    assert result.returncode == 2 and "no_such_mod_x" in result.stderr, str(result)


def test_doctor_after_a_zarr_read_warns_of_nothing_and_workers_read_it():
    result = check_script("doctor_scenario.py", "zarr", timeout=110)
    out = result.stdout
    handled = _check_handled_report(out, "zarrs", "zarrs' rayon pool")
    # zarr's own threads are not a hazard: zarr re-creates its loop and executor in a forked child.
    loop = next(item for item, by in handled if "zarr_io" in item)
    assert "asyncio_0" in loop, out
    assert "zarr.core.sync.reset_resources_after_fork" in dict(handled)[loop], out
    assert "WORKERS OK" in result.stderr, str(result)  # and forked workers did read the array


def test_doctor_after_a_polars_query_warns_of_nothing_and_workers_query():
    result = check_script("doctor_scenario.py", "polars", timeout=110)
    _check_handled_report(result.stdout, "polars", "polars' rayon pool")
    assert "WORKERS OK" in result.stderr, str(result)


def test_doctor_after_an_h5py_open_warns_of_nothing_and_workers_read_it():
    result = check_script("doctor_scenario.py", "h5py", timeout=110)
    _check_handled_report(result.stdout, "files", "open h5py file")
    assert "WORKERS OK" in result.stderr, str(result)


def test_doctor_warns_with_a_remedy_for_gnu_openmp_without_the_threadpools_backend():
    result = run_script("doctor_scenario.py", "openmp", timeout=90)
    assert result.returncode == 0, str(result)
    out = result.stdout
    warnings = _items(_section(out, BREAKS))
    assert len(warnings) == 1, out
    item, remedy = warnings[0]
    assert item.startswith("  [WARN] GNU OpenMP (libgomp): 1 native thread(s) (tids"), out
    assert "A worker running a parallel region with >1 thread would hang" in item, out
    assert remedy.strip().startswith("remedy: remove 'threadpools' from safeloader.configure(disable_hooks=...)"), out
    assert "torch.set_num_threads(1)" in remedy and "on_unsafe_fork='forkserver'" in remedy, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("1 problem(s): GNU OpenMP (libgomp) -> remove 'threadpools'"), out
    assert all("[WARN]" not in line for line in _section(out, HANDLED)), out
