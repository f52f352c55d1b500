"""Which shared object started each native thread of this process, read without stopping it
(why: docs/internals.md)."""

from __future__ import annotations

import os
import struct
import time
from bisect import bisect_right
from collections.abc import Callable

from .. import native
from .native_libraries import SYSTEM_LIBRARIES, is_system

__all__ = ["SYSTEM_LIBRARIES", "code_owner_at", "library_of", "owners"]

_STACK_BYTES = 1 << 20  # at most this much of a stack is read: a pool thread's live frames take a few KB
_POINTER = struct.calcsize("P")


class _Segments:
    """Where this process's loaded code lies (the dynamic loader's list), and which mapping holds a stack."""

    def __init__(self) -> None:
        self._counters: tuple[int, int] | None = None
        self.starts: list[int] = []  # executable segments of loaded objects, sorted
        self.ends: list[int] = []
        self.names: list[str] = []  # as the loader found them: resolved on first use (_resolved)
        self._resolved: dict[str, str | None] = {}
        self._calls: dict[int, bool] = {}  # address -> whether a call instruction ends before it
        self.all_starts: list[int] = []  # every mapping (stacks included), from /proc/self/maps
        self.all_ends: list[int] = []

    def refresh(self) -> None:
        from .. import _loader_lock

        counters = native.loaded_counters()
        if counters is not None and counters == self._counters and self.starts:
            return
        segments = sorted(_loader_lock.section(native.code_segments))
        self._counters = counters
        self._calls = {}
        self.starts = [start for start, _, _ in segments]
        self.ends = [end for _, end, _ in segments]
        self.names = [name for _, _, name in segments]

    def name_at(self, address: int) -> str | None:
        i = bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.ends[i]:
            return None
        name = self.names[i]
        if name not in self._resolved:
            self._resolved[name] = _resolve(name)
        return self._resolved[name]

    def after_call(self, address: int) -> bool:
        """Whether ``address`` follows a call instruction (``_after_call``), its code read through
        /proc/self/mem (an object unloaded meanwhile reads as an error, never a crash); kept per
        address until the loaded objects change."""
        found = self._calls.get(address)
        if found is None:
            try:
                code = _memory("self", address - 8, 8) if address >= 8 else b""
                found = len(code) == 8 and _after_call(code)
            except OSError:
                found = False
            self._calls[address] = found
        return found

    def mapping_end(self, address: int) -> int | None:
        end = _vma_end(address)
        if end is not _UNKNOWN:
            return end
        i = bisect_right(self.all_starts, address) - 1
        if i < 0 or address >= self.all_ends[i]:  # a stack mapped since the last read
            with open("/proc/self/maps", "rb") as maps:
                self.all_starts, self.all_ends, _, _, _ = native.parse_maps(maps.read())
            i = bisect_right(self.all_starts, address) - 1
        return self.all_ends[i] if i >= 0 and address < self.all_ends[i] else None


def _resolve(name: str) -> str | None:
    """A loaded object's path as /proc/self/maps shows it (symbolic links resolved); the main
    program's for "", None for objects that are no file (the vDSO)."""
    if not name:
        try:
            return os.readlink("/proc/self/exe")
        except OSError:
            return None
    return os.path.realpath(name) if name.startswith("/") else None


# PROCMAP_QUERY (linux/fs.h): _IOWR('f', 17, struct procmap_query), a 104-byte struct whose
# first fields are size, query_flags, query_addr, vma_start, vma_end (u64 each).
_PROCMAP_QUERY = 0xC0686611
_PROCMAP_QUERY_SIZE = 104
_UNKNOWN = -1
_procmap_query = True  # until the kernel says it has no such request (module state: the kernel's answer)


def _vma_end(address: int) -> int | None:
    """The end of the mapping that holds ``address`` (None: none does), asked of the kernel
    for that one address; _UNKNOWN where the kernel predates PROCMAP_QUERY."""
    global _procmap_query
    if not _procmap_query:
        return _UNKNOWN
    import errno
    import fcntl

    request = bytearray(_PROCMAP_QUERY_SIZE)
    struct.pack_into("=QQQ", request, 0, _PROCMAP_QUERY_SIZE, 0, address)  # flags 0: the covering mapping
    try:
        fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.ioctl(fd, _PROCMAP_QUERY, request, True)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return None
        _procmap_query = False  # ENOTTY/EINVAL: an older kernel (or a filter): read the maps instead
        return _UNKNOWN
    finally:
        os.close(fd)
    return struct.unpack_from("=Q", request, 32)[0]


# Module state: the process's code segments and threads (a forked child starts over: _owners holds its pid).
_segments: _Segments | None = None
# A thread is keyed by its id and its start time: a thread id is reused once its thread ended (pid_max
# can be 32768), and a new thread under an old id must not inherit the dead one's library.
_owners: tuple[int, dict[tuple[int, int], str]] = (0, {})  # (pid, (tid, start) -> the object it started in)
_waited: set[tuple[int, int]] = set()  # threads once waited for while running: never waited for again
_KEPT = 256  # entries of threads not asked about kept at most (threads ended, or a caller's subset)


def _memory(process: str, address: int, length: int) -> bytes:
    """``length`` bytes of ``/proc/<process>/mem`` from ``address`` (to the end of its page, where
    the mapping ends sooner); the descriptor is not kept (a forked worker would inherit it).
    Raises OSError where it is unmapped or /proc refuses."""
    fd = os.open(f"/proc/{process}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            return os.pread(fd, length, address)
        except OSError:
            return os.pread(fd, 4096 - address % 4096, address)
    finally:
        os.close(fd)


def _blocked_at(syscall_path: str) -> tuple[str, int, int] | None:
    """(the line, stack pointer, instruction pointer) of a thread blocked in a system call, from its
    ``/proc/.../syscall``; None if it runs, ended, or the line has no pointers."""
    try:
        line = native.read_proc(syscall_path).strip()
        fields = line.split()
        if len(fields) < 3 or fields[0] == "running":
            return None
        return line, int(fields[-2], 16), int(fields[-1], 16)
    except (OSError, ValueError):
        return None


def _mappings() -> _Segments:
    global _segments
    if _segments is None:
        _segments = _Segments()
    _segments.refresh()
    return _segments


def _objects_on(data: bytes, segments: _Segments) -> list[str]:
    """The objects outside the C/C++ runtimes that the words of ``data`` point into, in order."""
    found = []
    for (word,) in struct.iter_unpack("P", data[: len(data) - len(data) % _POINTER]):
        name = segments.name_at(word)
        if name is not None and not is_system(name, False):
            found.append(name)
    return found


def _outermost_object(data: bytes, segments: _Segments) -> str | None:
    """The last of ``_objects_on(data)`` that names the thread's code, found from the end: the
    outermost frames lie at the top of the stack, so the walk stops within a few hundred words
    instead of reading them all.

    Above the C runtime's first return address (its thread start: glibc's ``start_thread``) lie the
    thread's descriptor and static TLS, where any pointer into code counts: the start routine a
    library passed to ``pthread_create`` is there (pyarrow's threads show libarrow only so). Below
    it, in the frames, only a return address counts (``_Segments.after_call``): a word that merely
    falls in some object's code is skipped. DuckDB's busy pool thread held 0x7f6f00000001 among its
    outer frames (an int beside a stack address's upper half), inside libtorch_cpu's 280 MB of code
    there, and was counted as torch's thread."""
    count = len(data) // _POINTER
    in_frames = False
    for word in reversed(struct.unpack(f"{count}P", data[: count * _POINTER])):
        name = segments.name_at(word)
        if name is None:
            continue
        if is_system(name, False):
            in_frames = in_frames or segments.after_call(word)
        elif not in_frames or segments.after_call(word):
            return name
    return None


_MACHINE = os.uname().machine


def _after_call(code: bytes) -> bool:
    """Whether ``code``, the 8 bytes before an address, ends with a call instruction (the address
    is then a return address): x86-64's call rel32 or call r/m64 (any addressing form, its length
    checked), AArch64's bl or blr (with or without pointer authentication). True elsewhere."""
    if _MACHINE in ("x86_64", "amd64"):
        if code[3] == 0xE8:
            return True
        for length in (2, 3, 4, 6, 7):
            opcode, modrm = code[8 - length], code[9 - length]
            if opcode == 0xFF and (modrm >> 3) & 7 == 2 and _modrm_length(modrm, code, 10 - length) == length:
                return True
        return False
    if _MACHINE in ("aarch64", "arm64"):
        insn = int.from_bytes(code[4:], "little")
        return (insn & 0xFC000000) == 0x94000000 or (insn & 0xFFFFFC1F) == 0xD63F0000 or (
            insn & 0xFEFFF800) == 0xD63F0800
    return True


def _modrm_length(modrm: int, code: bytes, sib_at: int) -> int:
    """The length of an ``FF /2`` call whose ModRM byte is ``modrm`` (its SIB byte, if any, at ``sib_at``)."""
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return 2
    sib = 1 if rm == 4 else 0
    if mod == 1:
        return 3 + sib
    if mod == 2:
        return 6 + sib
    if rm == 5:
        return 6  # RIP-relative, disp32
    if sib and sib_at < len(code) and code[sib_at] & 7 == 5:
        return 7  # SIB with no base: disp32
    return 2 + sib


def code_owner_at(address: int) -> str | None:
    """The real path of the loaded object whose code holds ``address`` (an instruction pointer), the
    main program's for its own code; None where none does (the vDSO, code made at run time)."""
    return _mappings().name_at(address)


def library_of(tid: int) -> str | None:
    """The object (its path as mapped) that thread ``tid`` was started in, while it is blocked in
    a system call: the outermost object on its stack outside the C/C++ runtimes, else the one its
    instruction pointer is in. None if it runs, ended, or shows none."""
    blocked = _blocked_at(f"/proc/self/task/{tid}/syscall")
    if blocked is None:
        return None
    _, stack, pc = blocked
    segments = _mappings()
    end = segments.mapping_end(stack)
    if end is not None:
        try:
            outermost = _outermost_object(_memory("self", stack, min(end - stack, _STACK_BYTES)), segments)
        except OSError:  # the thread exited meanwhile
            return None
        if outermost is not None:
            return outermost
    where = segments.name_at(pc)
    return where if where is not None and not is_system(where, False) else None


# A pool's threads spin a little after their last task (rayon: a few milliseconds) before
# they block: a thread never attributed that is running now is asked again, this often.
_RUNNING_RETRIES = 50
_RUNNING_PAUSE = 0.001


def owners(threads: tuple[tuple[int, str], ...], before_waiting: Callable[[], object] | None = None
           ) -> dict[int, str | None]:
    """``library_of`` for each (tid, kernel name) of ``threads``, kept once found (a thread
    keeps its owner). One seen running the first time it is asked is asked again for up to
    50 ms (a pool's threads spinning after work); after that, once per call, with no wait.
    ``before_waiting``: called once, before that wait, where there is one (the fork-time check
    stops the pools it may stop anyway: threads that exit are not waited for)."""
    global _owners, _waited
    if _owners[0] != os.getpid():  # a forked child: thread ids of another process
        _owners, _waited = (os.getpid(), {}), set()
    known = _owners[1]
    found: dict[int, str | None] = {}
    keys: dict[int, tuple[int, int]] = {}
    for tid, _ in threads:
        start = _started(tid)
        found[tid] = None
        if start is not None:  # else it ended: no owner
            keys[tid] = (tid, start)
    pending = list(keys.values())
    for attempt in range(_RUNNING_RETRIES + 1):
        running = []
        for key in pending:
            library = known.get(key)
            if library is None:
                library = library_of(key[0])
                if library is not None:
                    known[key] = library
                elif key not in _waited and _is_running(key[0]):
                    running.append(key)
            found[key[0]] = library
        if not running or attempt == _RUNNING_RETRIES:
            _waited.update(running)  # still running after the wait: busy, not spinning down
            break
        pending = running
        if attempt == 0 and before_waiting is not None:
            before_waiting()
            continue  # asked again at once: a thread that exited meanwhile is not waited for
        time.sleep(_RUNNING_PAUSE)
    if len(known) + len(_waited) > len(keys) + _KEPT:  # ended threads' entries: not kept for ever
        asked = set(keys.values())
        _owners = (_owners[0], {key: library for key, library in known.items() if key in asked})
        _waited = _waited & asked
    return found


def _started(tid: int) -> int | None:
    """When thread ``tid`` of this process started (clock ticks since boot: field 22 of its
    ``stat``), or None where it ended. Two threads under one id cannot start within one tick: the
    id would have to be handed out pid_max times meanwhile."""
    try:
        stat = native.read_proc(f"/proc/self/task/{tid}/stat", 1024)
        return int(stat[stat.rindex(")") + 2 :].split(maxsplit=20)[19])
    except (OSError, ValueError, IndexError):
        return None


def _is_running(tid: int) -> bool:
    try:
        return native.read_proc(f"/proc/self/task/{tid}/syscall", 7) == "running"
    except OSError:
        return False


def objects_on_stack(pid: int) -> list[str]:
    """The loaded objects (C runtimes left out) that the innermost 16 KB of the main thread of
    process ``pid`` (a forked worker of this process) point into, innermost first: where it
    waits, without its native stack dumper. Empty if it runs or cannot be read."""
    blocked = _blocked_at(f"/proc/{pid}/syscall")
    if blocked is None:
        return []
    try:
        return _objects_below(pid, blocked[1])
    except OSError:
        return []


def _objects_below(pid: int, stack_pointer: int) -> list[str]:
    """``_objects_on`` the innermost 16 KB of a stack of process ``pid``; OSError where unreadable."""
    return _objects_on(_memory(str(pid), stack_pointer, 16384), _mappings())


def wait_in(pid: int, libraries: frozenset[str]) -> tuple[str, str, int] | None:
    """Whether the main thread of ``pid`` (a forked worker of this process, with its mappings) waits inside one
    of ``libraries``: (its system call line, the library, its CPU ticks), else None."""
    blocked = _blocked_at(f"/proc/{pid}/syscall")
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read().rsplit(")", 1)[1].split()
        ticks = int(stat[11]) + int(stat[12])  # utime + stime (fields 14 and 15)
        if blocked is None:
            return None
        objects = _objects_below(pid, blocked[1])
    except (OSError, ValueError, IndexError):
        return None
    for name in objects:
        if name in libraries:
            return blocked[0], name, ticks
    return None


def live_libraries(before_waiting: Callable[[], object] | None = None) -> dict[str, int]:
    """Object each live native thread waits in -> how many threads (``before_waiting``: ``owners``')."""
    counts: dict[str, int] = {}
    for library in owners(native.thread_census().foreign, before_waiting).values():
        if library is not None:
            counts[library] = counts.get(library, 0) + 1
    return counts
