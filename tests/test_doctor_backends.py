"""A backend registered from the user's own module takes part in ``safeloader doctor`` as a built-in does."""

from __future__ import annotations

import pytest

from .subproc import check_python

pytestmark = pytest.mark.timeout(120)

# A user's module, outside safeloader: its backend's hook, what it sees live, and one whose hazards() fails.
USER_MODULE = '''
import threading

import safeloader

held = threading.Event()
io_thread = threading.Thread(target=held.wait, name="mylib-io", daemon=True)
io_thread.start()


class MyLibBackend(safeloader.Backend):
    name = "mylib"
    description = "each worker reopens mylib's session"

    def after_in_child(self, plan):
        pass

    def hazards(self):
        what = "mylib session db://x is open: workers would share its socket"
        fix = "open it in each worker"
        return [safeloader.Hazard("session", "mylib", what, otherwise=fix, threads=(io_thread.ident,))]


class BrokenBackend(safeloader.Backend):
    name = "brokenlib"
    description = "a backend whose hazards() fails"

    def hazards(self):
        raise RuntimeError("boom")


safeloader.register_backend(MyLibBackend)
safeloader.register_backend(BrokenBackend)
'''


def test_a_backend_from_a_users_module_is_in_doctors_hooks_and_hazards(tmp_path):
    (tmp_path / "mylib_backend.py").write_text(USER_MODULE)
    result = check_python(
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import mylib_backend, safeloader\n"
        "safeloader.doctor()\nprint('=' * 20)\nsafeloader.disable('mylib')\nsafeloader.doctor()\n",
        timeout=90,
    )
    on, off = result.stdout.split("=" * 20 + "\n")
    on_lines = on.splitlines()
    row = on_lines.index("  [on ] mylib                active")
    assert on_lines[row + 1] == "        each worker reopens mylib's session", on
    item = on_lines.index("  [ok  ] mylib session db://x is open: workers would share its socket")
    assert on_lines[item + 1] == "         handled by: hook 'mylib': each worker reopens mylib's session", on
    assert "mylib-io" not in on, on  # its thread is the backend's, not among the "other Python threads"
    unknown = "  [??  ] backend 'brokenlib' could not say what is live (RuntimeError: boom)"
    assert unknown in on_lines and on_lines[on_lines.index(unknown) + 1].endswith("fix BrokenBackend.hazards()"), on

    off_lines = off.splitlines()
    assert "  [off] mylib                disabled (safeloader.disable)" in off_lines, off
    item = off_lines.index("  [WARN] mylib session db://x is open: workers would share its socket")
    assert off_lines[item + 1] == "         remedy: call safeloader.enable('mylib'), or open it in each worker", off
    assert off_lines[-1] == "1 problem(s): mylib -> call safeloader.enable('mylib'), or open it in each worker", off
