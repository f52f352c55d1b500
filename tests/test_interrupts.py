"""Ctrl-C during a loader start (issue 21, item 3): a KeyboardInterrupt raised before and after
each built-in hook's parent-side code reaches the caller as itself (never a HookError), every
hook's state is rolled back, nothing is left held (the next start works, from the main thread
and from another one) and no worker is left behind. Runs in a child under a deadline.
"""

from __future__ import annotations

import pytest

from tests.subproc import check_script

pytestmark = pytest.mark.timeout(240)


def test_a_keyboard_interrupt_in_each_builtin_hooks_parent_phase_reaches_the_user_and_the_next_start_works():
    result = check_script("interrupt_in_each_hook.py", timeout=150)
    lines = result.stdout.splitlines()
    assert len(lines) > 10, result  # the hooks of this environment, each phase, each place
    assert all(line.endswith(": ok") for line in lines[1:]), result
