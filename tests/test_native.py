"""The C extension and its pure-Python fallback give the same answers; CI needs the extension."""

from __future__ import annotations

import inspect
import json
import os
import sys

import pytest

import safeloader
from safeloader import native

from .subproc import check_python, check_script

pytestmark = pytest.mark.timeout(60)


def test_native_extension_is_built_when_expected():
    # The test command exports SAFELOADER_REQUIRE_NATIVE=1 and builds with it,
    # so a missing compiler fails the build; this catches an import that
    # silently fell back. Set SAFELOADER_REQUIRE_NATIVE=0 where no compiler exists.
    expected = os.environ.get("SAFELOADER_REQUIRE_NATIVE", "1") != "0"
    assert safeloader.NATIVE is expected, (
        f"safeloader.NATIVE must be {expected} here, got {safeloader.NATIVE}: "
        "the C extension safeloader._native was not built or failed to import"
    )


def test_read_proc_reads_what_a_file_object_reads_and_stops_at_its_size(tmp_path):
    # forkstate and the thread attribution read each native thread's /proc/.../syscall with it.
    with open("/proc/self/status") as status:
        name_line = status.readline()
    assert native.read_proc("/proc/self/status").splitlines()[0] == name_line.rstrip("\n")
    assert native.read_proc("/proc/self/status", 5) == name_line[:5]
    tid = native.thread_ids()[0]
    with open(f"/proc/self/task/{tid}/comm") as comm:
        assert native.read_proc(f"/proc/self/task/{tid}/comm") == comm.read()
    with pytest.raises(FileNotFoundError):
        native.read_proc(str(tmp_path / "missing"))


def test_thread_ids_agree_with_threads_running():
    result = check_script("native_parity.py", "thread_ids", timeout=30)
    assert result.stdout.strip() == "ok"


def test_threads_within_says_whether_a_thread_started_since_an_earlier_list():
    # The parent asks it between a loader start's worker forks (forkstate.unchanged_since_record).
    result = check_script("native_parity.py", "threads_within", timeout=30)
    assert result.stdout.strip() == "ok", result.stdout


def test_thread_census_counts_a_forked_processs_main_thread_as_python():
    # In a process that was itself forked (a multiprocessing or forkserver child, a fork
    # server's), CPython's threading keeps the forking parent's thread id as the main thread's
    # native_id: the census took the main thread for a native pool's, and a stall report then
    # blamed "python's native threads" for a lock a Python thread held.
    result = check_python(
        """
        import os
        from safeloader import native

        pid = os.fork()
        if pid == 0:
            census = native.thread_census()
            print(census.python == ((os.getpid(), "MainThread"),), census.foreign, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        """,
        timeout=30,
    )
    assert result.stdout.strip() == "True ()", result.stdout


def test_descriptor_table_agrees_and_describes_each_descriptor():
    result = check_script("native_parity.py", "descriptor_table", timeout=30)
    assert result.stdout.strip() == "ok"


def test_regular_file_offsets_agree_and_skip_what_cannot_seek():
    result = check_script("native_parity.py", "regular_file_offsets", timeout=30)
    assert result.stdout.strip() == "ok"


def test_file_records_agree_and_record_each_regular_file_at_its_offset():
    result = check_script("native_parity.py", "file_records", timeout=30)
    assert result.stdout.strip() == "ok"


def test_privatize_files_agree_and_give_each_read_only_file_its_own_offset_or_report_why_not():
    # Skipped alike: writable, exclusively locked (unless the locks were read before), /proc, asked to
    # skip; a record of another file since reads the offset now; a worker with no descriptor left
    # reports each reopen failed (EMFILE). exclusively_locked agrees on which descriptions hold a lock.
    result = check_script("native_parity.py", "privatize_files", timeout=30)
    assert result.stdout.strip() == "ok", result


@pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")
def test_lock_reader_reads_each_lock_unseen_by_the_census_and_leaks_nothing_into_a_fork():
    # The parent's thread that reads a start's locks while it forks: each lock read into the shared
    # states (one exclusively locked: 2, shared-locked and free: 1), left out of thread_ids and
    # threads_within while it runs (it is no library's pool), none of its descriptors in a child
    # forked meanwhile (a table of its own); stopping it early leaves the rest to the workers.
    result = check_script("native_parity.py", "lock_reader", timeout=60)
    assert result.stdout.strip() == "ok", result


def test_descriptor_kinds_agree_and_see_read_only_files_and_tcp_sockets():
    # What the child starts with (stdin: /dev/null; stdout: the helper's file, open for writing, or a
    # pipe), a file open for writing (2), unix and UDP sockets (no kind), a TCP socket (4), an
    # O_PATH descriptor (a regular file, not readable), a file open read-only (1), all closed.
    result = check_script("native_parity.py", "descriptor_kinds", timeout=30)
    seen = [int(kinds) for kinds in result.stdout.split()]
    start = seen[0]
    assert start in (0, 2) and seen == [start, 2, 2, 6, 6, 7, start], result.stdout


def test_parse_maps_agrees_with_the_fallback_and_finds_every_loaded_object():
    from safeloader import _native_fallback

    with open("/proc/self/maps", "rb") as maps:
        data = maps.read()
    parsed = native.parse_maps(data)
    assert parsed == _native_fallback.parse_maps(data)
    all_starts, all_ends, starts, ends, names = parsed
    assert len(all_starts) == len(data.splitlines()) and all(a < b for a, b in zip(all_starts, all_ends))
    assert any(os.path.basename(name).startswith("libc") for name in names)
    assert all(name.startswith("/") for name in names) and len(starts) == len(ends) == len(names)


def test_code_segments_are_the_executable_mappings_of_the_loaded_objects_and_agree_with_the_fallback():
    # Thread attribution reads the loaded code from the dynamic loader instead of /proc/self/maps
    # (the kernel writes out every mapping: 2-3 ms with 300 libraries): the same code, same names.
    from safeloader import _native_fallback

    _native_fallback.code_segments(False)  # its first call may load what ctypes needs
    segments = native.code_segments(True)
    assert segments == native.code_segments(False) == _native_fallback.code_segments(True)
    with open("/proc/self/maps", "rb") as maps:
        _, _, starts, ends, names = native.parse_maps(maps.read())
    mapped = {name: [] for name in names}
    for start, end, name in zip(starts, ends, names):
        mapped[name].append((start, end))
    # An extension copy loaded from a memfd (zarrs' or polars' spare copy, loaded by an earlier test
    # in this process) is named by the path it was opened by, /proc/<pid>/fd/<n>, and its maps
    # by the memfd's name, "/memfd:... (deleted)": neither is a file, so neither is compared.
    segments = [segment for segment in segments if not segment[2].startswith("/proc/")]
    names = [name for name in names if not name.startswith("/memfd:")]
    found = 0
    for start, end, name in segments:
        if not name.startswith("/"):  # the main program (""), the vDSO: no file of that name
            continue
        path = os.path.realpath(name)
        # The segment lies inside the executable mappings of that file (a mapping is page-aligned).
        assert any(low <= start and end <= high + 4095 for low, high in mapped[path]), (name, mapped.get(path))
        found += 1
    libraries = {os.path.realpath(name) for _, _, name in segments if name.startswith("/")}
    assert found and libraries == {name for name in names if name != os.readlink("/proc/self/exe")}


def test_fork_generation_agrees_across_os_fork():
    result = check_script("native_parity.py", "fork_generation", timeout=30)
    assert result.stdout.strip() == "['', '1 1', '2 2']"


def test_native_counter_sees_forks_that_bypass_os_fork():
    # libc's fork() called directly, twice, as a C library would: os.register_at_fork
    # handlers do not run, pthread_atfork handlers do. The fallback sees that its pid
    # changed (one fork), not how many forks made it: its documented gap.
    result = check_script("native_parity.py", "libc_fork", timeout=30)
    assert result.stdout.strip() == "['', '1 1', '2 1']"


@pytest.mark.parametrize("fallback", [False, True], ids=["extension", "fallback"])
def test_worker_hooks_see_the_workers_fork_generation(fallback):
    # Issue 24 item 3: the fallback counted the fork in an os.register_at_fork callback
    # registered after the registry's, so a worker's hooks read the parent's count and
    # parent_state() was None there. The extension counts in a pthread_atfork handler.
    if not fallback and not safeloader.NATIVE:
        pytest.skip("needs the C extension")
    env = {"SAFELOADER_DISABLE_NATIVE": "1"} if fallback else {}
    result = check_script("worker_hook_generation.py", timeout=60, env=env)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["native"] is not fallback, result
    assert seen["generation"] == seen["parent"] + 1, result
    assert seen["parent_state"] is True, result


def test_thread_census_separates_python_threads_from_native_pools():
    import threading

    import numpy as np

    a = np.ones((400, 400))
    a @ a  # OpenBLAS starts its worker threads
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="census-probe")
    thread.start()
    try:
        census = native.thread_census()
    finally:
        stop.set()
        thread.join()
    assert (thread.native_id, "census-probe") in census.python
    python_ids = {tid for tid, _ in census.python}
    assert python_ids.isdisjoint(tid for tid, _ in census.foreign)
    if (os.cpu_count() or 1) > 1:
        assert census.foreign, "OpenBLAS threads must show up as threads Python did not start"


NATIVE_FUNCTIONS = (
    "fork_generation",
    "thread_ids",
    "threads_within",
    "descriptor_table",
    "descriptor_kinds",
    "regular_file_offsets",
    "file_records",
    "file_offsets",
    "privatize_files",
    "exclusively_locked",
    "read_locks_behind",
    "lock_reader_identified",
    "stop_lock_reader",
    "reserve_descriptor_slots",
    "signal_handler_address",
    "free_signals",
    "exit_handler_lock",
    "loaded_objects",
    "parse_maps",
    "code_segments",
    "install_backtrace_handler",
    "release_backtrace_handler",
    "warm_backtrace",
    "signal_thread",
    "stop_if_parked",
    "keep_errno",
    "probe_python_frames",
    "python_frames",
    "thread_state",
    "fast_fork_arm",
    "fast_fork_disarm",
    "fast_fork_before",
    "fast_fork_after_in_parent",
    "fast_fork_in_child",
    "fast_fork_python_fork",
)


@pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")
def test_extension_and_fallback_have_the_same_functions_and_parameters():
    from safeloader import _native, _native_fallback

    assert _native.__doc__, "the extension has a module docstring"
    public = sorted(name for name in dir(_native) if not name.startswith("_"))
    assert public == sorted(NATIVE_FUNCTIONS)
    for name in NATIVE_FUNCTIONS:
        native_parameters = list(inspect.signature(getattr(_native, name)).parameters)
        fallback_parameters = list(inspect.signature(getattr(_native_fallback, name)).parameters)
        assert native_parameters == fallback_parameters, name


@pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")
def test_loaded_objects_and_signal_dispositions_agree_with_the_fallback():
    from safeloader import _native, _native_fallback

    _native_fallback.loaded_objects(True, False)  # its first call may load what ctypes needs
    for release_gil in (False, True):
        assert _native.loaded_objects(True, release_gil) == _native_fallback.loaded_objects(True, release_gil)
        assert _native.loaded_objects(False, release_gil) == (_native_fallback.loaded_objects(False, False)[0], None)
    # faulthandler installs in C, where signal.getsignal does not see it; both versions do.
    check_python(
        """
        import faulthandler, signal
        from safeloader import _native, _native_fallback
        free = signal.SIGRTMIN + 5
        assert _native.signal_handler_address(free) == _native_fallback.signal_handler_address(free) == 0
        signal.signal(free, signal.SIG_IGN)
        assert _native.signal_handler_address(free) == _native_fallback.signal_handler_address(free) == 1
        faulthandler.register(free)
        assert signal.getsignal(free) == signal.SIG_IGN, "Python's view stays stale"
        assert _native.signal_handler_address(free) > 2 and _native_fallback.signal_handler_address(free) == 2
        # free_signals: from SIGRTMAX down, skipping a Python handler, one installed in C, one ignored.
        top = signal.SIGRTMAX
        assert _native.free_signals(3) == _native_fallback.free_signals(3) == [top, top - 1, top - 2]
        signal.signal(top, lambda *_: None)
        faulthandler.register(top - 1)
        signal.signal(top - 2, signal.SIG_IGN)
        assert _native.free_signals(2) == _native_fallback.free_signals(2) == [top - 3, top - 4]
        assert _native.free_signals(0) == _native_fallback.free_signals(0) == []
        """,
        timeout=30,
    )


def test_executing_the_module_again_counts_each_fork_once():
    # Multi-phase init runs the module's exec slot on each fresh import; the
    # pthread_atfork handler must still be registered once per process.
    result = check_script("native_reimport.py", timeout=30)
    assert result.stdout.strip() == "1 1"


# Source text for interpreters.run_string (a subinterpreter runs a string, not a file); it stays a
# string, formatted with the extension's path in the outer child.
IN_OWN_GIL_INTERPRETER = """
import importlib.util
spec = importlib.util.spec_from_file_location("safeloader._native", {path!r})
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
assert native.fork_generation() == 0 and native.thread_ids() and native.loaded_objects(True, True)[1]
"""


@pytest.mark.skipif(sys.version_info < (3, 12), reason="per-interpreter GIL: Python 3.12+")
def test_extension_loads_in_an_interpreter_with_its_own_gil():
    # The extension declares Py_MOD_PER_INTERPRETER_GIL_SUPPORTED. Only the
    # extension is loaded there: the package imports faulthandler, which does
    # not support such interpreters. Python's module for creating one is private.
    result = check_python(
        f"""
try:
    import _interpreters as interpreters
except ImportError:
    import _xxsubinterpreters as interpreters
from safeloader import _native
interpreter = interpreters.create()  # isolated: its own GIL
failure = interpreters.run_string(interpreter, {IN_OWN_GIL_INTERPRETER!r}.format(path=_native.__file__))
interpreters.destroy(interpreter)
print(failure or "ok")
""",
        timeout=30,
    )
    assert result.stdout.strip() == "ok", result


def test_fallback_can_be_forced():
    result = check_python(
        "import safeloader; print(safeloader.NATIVE)", timeout=30, env={"SAFELOADER_DISABLE_NATIVE": "1"}
    )
    assert result.stdout.strip() == "False"
