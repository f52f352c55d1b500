"""glibc's exit-handler lock, held by another thread of the parent at a worker's fork.

__cxa_atexit (a C++ static's first use registers its destructor through it) takes a lock
that fork() does not make new in the child. Seen in CI: loaders started from several
threads at once, one thread's first tensor operations registering destructors while
another forked; its worker waited for ever in torch.set_num_threads(1), torch's thread
pool being a function-local static. safeloader's C extension releases the lock in each
fork child (csrc/exit_lock.c).
"""

from __future__ import annotations

import ctypes
import os
import platform

import pytest

from safeloader import native

from .subproc import check_python, check_script, run_script

pytestmark = pytest.mark.timeout(120)

needs_the_lock = pytest.mark.skipif(
    not native.NATIVE or platform.machine() != "x86_64",
    reason="the lock is found by the C extension, from x86-64 code only",
)


@pytest.mark.torch_baseline
def test_torch_hangs_when_a_parent_thread_holds_the_exit_handler_lock_at_fork():
    assert run_script("exit_lock_at_fork.py", "torch", timeout=30, expect_hang=True).timed_out


@needs_the_lock
def test_safeloader_workers_register_exit_handlers_while_a_parent_thread_holds_the_lock():
    result = check_script("exit_lock_at_fork.py", "safeloader", timeout=90)
    assert "items [0, 1, 2, 3, 4, 5, 6, 7]" in result.stdout, result
    # The lock was held at the worker's fork, so the items above were made in a freed child.
    assert "held at fork [" in result.stdout and "True" in result.stdout.split("held at fork")[1], result


@needs_the_lock
def test_the_lock_found_is_a_free_lock_word_in_glibcs_writable_data():
    address, held_at_fork = native.exit_handler_lock()
    # libc's writable mapping, and its .bss continuing in the anonymous mapping right after it.
    writable, end = [], None
    with open("/proc/self/maps") as maps:
        for line in maps:
            bounds, permissions, *rest = line.split()
            start, stop = (int(bound, 16) for bound in bounds.split("-"))
            path = rest[-1] if len(rest) == 4 else ""
            if "w" in permissions and (os.path.basename(path).startswith("libc.so") or (not path and start == end)):
                writable.append((start, stop))
                end = stop
    assert any(start <= address < stop for start, stop in writable), (hex(address), writable)
    assert ctypes.c_int.from_address(address).value == 0  # no thread registers an exit handler now
    assert held_at_fork is False  # the test process was not forked with it held


def test_without_the_extension_the_lock_is_not_looked_for():
    code = "from safeloader import native; print(*native.exit_handler_lock())"
    result = check_python(code, timeout=60, env={"SAFELOADER_DISABLE_NATIVE": "1"})
    assert result.stdout.split() == ["0", "False"], result
