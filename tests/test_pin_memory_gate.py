"""The "pin_memory" backend's gate: uninstall() restores torch's function, and
two threads forking workers at once keep the gate closed until both are done."""

from __future__ import annotations

import threading

import pytest

from .subproc import check_script

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]


def test_uninstall_restores_torchs_own_pin_memory_function():
    # A fresh interpreter: this pytest process may hold the gate from other tests.
    assert "restored" in check_script("pin_memory_restored.py", timeout=50).stdout


def test_remove_gate_is_idempotent_and_the_next_armed_start_reinstalls_it():
    import torch.utils.data._utils.pin_memory as pin_module

    from safeloader import DataLoader
    from safeloader.backends import pin_memory as gate

    gate.remove_gate()
    original = pin_module.pin_memory
    assert not gate.gated()
    gate.remove_gate()
    assert pin_module.pin_memory is original
    list(DataLoader(range(4), num_workers=1))
    assert gate.gated()
    gate.remove_gate()
    assert pin_module.pin_memory is original and not gate.gated()


class Pinnable:
    """Stands in for a batch on an accelerator: records that it was pinned."""

    def __init__(self) -> None:
        self.pinned = threading.Event()

    def pin_memory(self):
        self.pinned.set()
        return self


def test_gate_stays_closed_until_both_of_two_concurrent_forks_are_done():
    import torch.utils.data._utils.pin_memory as pin_module

    import safeloader
    from safeloader.backends import pin_memory as gate

    gate.BACKEND.prepare_start(None, safeloader.get_options(), "fork")  # what an armed loader's start does
    assert gate.gated()

    # Two threads each run the hook's `before` (the fork is under way), then its
    # `after_in_parent`, in the order A before, B before, A after, B after.
    steps = [threading.Event() for _ in range(4)]
    done = [threading.Event() for _ in range(4)]

    def forking_thread(before_step: int, after_step: int) -> None:
        assert steps[before_step].wait(30)
        gate.BACKEND.before(None)
        done[before_step].set()
        assert steps[after_step].wait(30)
        gate.BACKEND.after_in_parent(None, None)
        done[after_step].set()

    a = threading.Thread(target=forking_thread, args=(0, 2))
    b = threading.Thread(target=forking_thread, args=(1, 3))
    a.start(), b.start()
    try:
        for step in (0, 1, 2):
            steps[step].set()
            assert done[step].wait(30)
        # A is done forking, B is still forking: a pin thread must wait at the gate.
        late = Pinnable()
        pinning = threading.Thread(target=pin_module.pin_memory, args=(late,), daemon=True)
        pinning.start()
        assert not late.pinned.wait(0.5), "the gate reopened while thread B was still forking"
        steps[3].set()
        assert done[3].wait(30)
        assert late.pinned.wait(30)  # B is done too: the gate is open
        pinning.join(30)
    finally:
        for step in steps:
            step.set()
        a.join(30), b.join(30)
    assert gate.BACKEND.gate.inside == 0
    pin_module.pin_memory(Pinnable())  # open for everyone


def test_after_in_parent_without_a_close_leaves_other_threads_closure_alone():
    import torch.utils.data._utils.pin_memory as pin_module

    import safeloader
    from safeloader.backends import pin_memory as gate

    gate.BACKEND.prepare_start(None, safeloader.get_options(), "fork")
    closed = threading.Event()
    release = threading.Event()

    def forking_thread() -> None:
        gate.BACKEND.before(None)
        closed.set()
        assert release.wait(30)
        gate.BACKEND.after_in_parent(None, None)

    forker = threading.Thread(target=forking_thread)
    forker.start()
    try:
        assert closed.wait(30)
        # A thread whose `before` found no gate (removed meanwhile) still runs `after_in_parent`.
        opener = threading.Thread(target=gate.BACKEND.after_in_parent, args=(None, None))
        opener.start(), opener.join(30)
        late = Pinnable()
        pinning = threading.Thread(target=pin_module.pin_memory, args=(late,), daemon=True)
        pinning.start()
        assert not late.pinned.wait(0.5), "another thread's after_in_parent opened this thread's fork"
        release.set()
        assert late.pinned.wait(30)
        pinning.join(30)
    finally:
        release.set()
        forker.join(30)
