"""Attributing a native thread to the library that started it, without /proc/self/maps on the way."""

from __future__ import annotations

import json
import os

import pytest

from .subproc import check_script, run_script

pytestmark = pytest.mark.timeout(60)


def test_threads_are_attributed_as_from_proc_self_maps_with_and_without_the_kernels_query():
    result = check_script("thread_owners_compare.py", timeout=45)
    report = json.loads(result.stdout)
    found = report["found"]
    assert any("openblas" in os.path.basename(path or "") for path in found.values()), report
    assert found == report["without_query"] == report["from_maps"], report
    assert all(path is None or os.path.realpath(path) == path for path in found.values()), report


@pytest.mark.parametrize("mode", ["stop", "wait", "thread"])
def test_a_start_right_after_a_blas_call_does_not_wait_for_openblas_spinning_threads(mode):
    # OpenBLAS's threads spin for work after a BLAS call; the check waited up to 50 ms for each new
    # one (at every start of a loop that calls BLAS between epochs). Its own fork handler stops them
    # at the fork: stopped just before the check instead, nothing is left to wait for. numpy 2.5's
    # OpenBLAS keeps that function private (found in its file's symbol table). With another Python
    # thread alive ("thread": idle, waiting on an Event, as trainers' threads do), only once the
    # check, holding the GIL, found it parked where it can only get back to the eval loop (before,
    # no stop: "pauses" was 49 and "stopped" 0 for "thread", as "wait" still shows).
    result = check_script("blas_before_start.py", mode, timeout=45)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["batches"] == [[0, 1, 2, 3], [4, 5, 6, 7]], report
    assert report["computes"], report
    assert report["running"] >= 1, report  # the scenario: a thread spinning at the start
    if mode == "wait":
        assert report["pauses"] >= 1 and report["stopped"] == 0, report  # as without the stop
    else:
        assert report["pauses"] == 0 and report["stopped"] >= 1, report


def test_openblas_is_not_stopped_while_another_python_thread_is_inside_blas():
    # The stop tells OpenBLAS's threads to exit; a product in progress on another thread then loses
    # its job and never returns: "busy-unchecked", the stop made without the check, hangs (the stop,
    # holding the GIL, waits for threads that wait for that job). With the check, the other thread
    # (numpy's return addresses on its stack) is seen inside BLAS: nothing stopped, its products right.
    unchecked = run_script("blas_before_start.py", "busy-unchecked", timeout=60, expect_hang=True)
    assert unchecked.timed_out, unchecked
    result = check_script("blas_before_start.py", "busy", timeout=45)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"stopped": 0, "products": [True, report["products"][1]], "ended": True}, report
    assert report["products"][1] >= 1, report


def _unshare() -> list[str] | None:
    """The command that runs a child in a user and PID namespace of its own, or None where this
    machine allows none (unprivileged user namespaces off, no unshare)."""
    import shutil
    import subprocess

    command = [shutil.which("unshare") or "unshare", "-Urpf", "--mount-proc", "--kill-child"]
    try:
        subprocess.run([*command, "true"], check=True, timeout=10, capture_output=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return command


def test_a_thread_id_reused_by_another_librarys_thread_is_not_given_the_dead_threads_library(tiny_pool):
    # A thread id is handed out again once its thread ended (pid_max can be 32768), and native pools'
    # threads mostly keep the kernel name of the thread that made them. Keyed by (id, name), the owner
    # of an OpenBLAS thread that a fork ended was inherited by the tiny_pool thread given its id
    # (checked: "after" was numpy's OpenBLAS). Keyed by (id, start time), it is found anew. The reuse is
    # real: the child chooses the next id in a PID namespace of its own.
    from .subproc import _checked, _run, script_command

    unshare = _unshare()
    if unshare is None:
        pytest.skip("no user and PID namespace for an unprivileged user here (unshare -Urpf)")
    command, env = script_command("reused_thread_id.py", tiny_pool, env={"OPENBLAS_NUM_THREADS": "2"})
    for _ in range(3):  # the reuse itself can miss (CI once: no thread had the id after): asked again
        report = json.loads(_checked(_run([*unshare, *command], 45, env, None)).stdout)
        if report["names"][1] is not None:
            break
    assert report["names"][0] == report["names"][1], report  # the case (id, name) could not tell apart
    assert "openblas" in os.path.basename(report["before"]), report
    assert report["after"] == str(tiny_pool), report


def test_an_owner_is_kept_per_thread_not_per_thread_id(monkeypatch):
    # The same, made up, in this process (where no namespace is allowed, this still runs): one id, two
    # threads one after the other (two start times), each blocked in its own library.
    from safeloader.diagnostics import thread_owners

    tid, libraries, starts = 4_000_000, ["/lib/first.so"], [1000]
    monkeypatch.setattr(thread_owners, "library_of", lambda asked: libraries[0] if asked == tid else None)
    monkeypatch.setattr(thread_owners, "_started", lambda asked: starts[0], raising=False)
    assert thread_owners.owners(((tid, "python"),)) == {tid: "/lib/first.so"}
    libraries[0], starts[0] = "/lib/second.so", 2000  # the first thread ended, its id reused
    assert thread_owners.owners(((tid, "python"),)) == {tid: "/lib/second.so"}
    assert thread_owners.owners(((tid, "python"),)) == {tid: "/lib/second.so"}  # and kept


def test_owners_of_ended_threads_are_not_kept_for_ever(monkeypatch):
    # A process whose libraries start and end threads all day: the entries of ended threads go.
    from safeloader.diagnostics import thread_owners

    monkeypatch.setattr(thread_owners, "library_of", lambda asked: "/lib/pool.so")
    monkeypatch.setattr(thread_owners, "_started", lambda asked: asked, raising=False)
    for tid in range(5_000_000, 5_002_000):  # one thread at a time, each ended before the next
        assert thread_owners.owners(((tid, "python"),)) == {tid: "/lib/pool.so"}
    assert len(thread_owners._owners[1]) <= thread_owners._KEPT + 1


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64's call encodings")
def test_a_return_address_is_told_from_a_word_that_only_falls_in_code():
    from safeloader.diagnostics.thread_owners import _after_call

    def before(*code: int) -> bytes:  # the 8 bytes before an address, ending with ``code``
        return bytes([0x90] * (8 - len(code)) + list(code))

    calls = [
        before(0xE8, 1, 2, 3, 4),  # call rel32
        before(0xFF, 0xD0), before(0x41, 0xFF, 0xD3),  # call rax, call r11
        before(0xFF, 0x10), before(0xFF, 0x50, 0x08), before(0xFF, 0x54, 0x24, 0x08),  # [rax], [rax+8], [rsp+8]
        before(0xFF, 0x15, 1, 2, 3, 4), before(0xFF, 0x90, 1, 2, 3, 4),  # [rip+disp32], [rax+disp32]
        before(0xFF, 0x94, 0x24, 1, 2, 3, 4), before(0xFF, 0x14, 0xC5, 1, 2, 3, 4),  # [rsp+disp32], [rax*8+disp32]
    ]
    assert all(_after_call(code) for code in calls)
    others = [
        before(), before(0xFF, 0xE0),  # jmp rax (a tail call: no return here)
        before(0xFF, 0x50),  # call [rax+disp8] cut short: the address is inside it
        before(0xFF, 0x15, 1, 2, 3), before(0xE8, 1, 2, 3), before(0x48, 0x89, 0xC7, 0xC3),  # mov; ret
        bytes([0x7F, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00]),
    ]
    assert not any(_after_call(code) for code in others)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64's call encodings")
def test_the_outermost_return_address_names_the_thread_not_a_stray_word_above_it():
    # DuckDB's busy pool thread in a child of the warm interpreter (Python 3.13) held 0x7f6f00000001 among
    # its outer frames (an int beside a stack address's upper half): inside libtorch_cpu's code there, so
    # the thread was counted as torch's, and DuckDB's pool as idle (its only busy thread). Made up here:
    # a return address into the pool's object, a stray word into torch's above it, then glibc's thread
    # start (a return address into libc), and above that the thread's descriptor, where the start
    # routine a library passed to pthread_create counts though no call precedes it (pyarrow's threads).
    import struct

    from safeloader.diagnostics import thread_owners

    call, other = bytes([0x90, 0x90, 0x90, 0xE8, 1, 2, 3, 4]), bytes(8)
    objects = {0x1000_0010: ("/lib/libpool.so", call), 0x7F6F_0000_0001: ("/lib/libtorch_cpu.so", other),
               0x2000_0010: ("/usr/lib/x86_64-linux-gnu/libc.so.6", call),
               0x3000_0000: ("/lib/libarrow.so", other)}

    class Segments:
        def name_at(self, address: int) -> str | None:
            return objects[address][0] if address in objects else None

        def after_call(self, address: int) -> bool:
            return thread_owners._after_call(objects[address][1])

    frames = [0x1000_0010, 42, 0x7F6F_0000_0001, 7, 0x2000_0010, 0]  # innermost first, as in memory
    assert thread_owners._outermost_object(struct.pack("6P", *frames), Segments()) == "/lib/libpool.so"
    started = struct.pack("8P", *frames, 0x3000_0000, 0)  # a start routine in the descriptor, above
    assert thread_owners._outermost_object(started, Segments()) == "/lib/libarrow.so"
