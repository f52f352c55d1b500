"""Code and stacks, in pure Python: the maps and loaded objects that name an address's library
(csrc/code_map.c, csrc/loaded_objects.c); native backtraces and frames read from outside, which
need the extension (csrc/backtrace.c, csrc/python_frames.c), are absent here."""

from __future__ import annotations

import os
from typing import Any


def install_backtrace_handler(signum: int, fd: int) -> bool:
    """No native backtraces without the extension: installs nothing, returns False.

    The stall watchdog then reports the worker's Python stacks only.
    """
    return False


def warm_backtrace(release_gil: bool) -> None:
    """Nothing to warm without the extension (no backtrace handler is installed)."""


def release_backtrace_handler(signum: int) -> bool:
    """Nothing was installed without the extension: nothing to release."""
    return False


def thread_state() -> int:
    """No thread state is published without the extension: 0."""
    return 0


def probe_python_frames() -> bool:
    """No frame is read from outside without the extension: False."""
    return False


def python_frames(pid: int, thread_state: int) -> list[tuple[str, str]] | None:
    """No frame is read from outside without the extension: None."""
    return None


def parse_maps(data: bytes) -> tuple[list[int], list[int], list[int], list[int], list[str]]:
    """(all_starts, all_ends, starts, ends, names) from the bytes of /proc/self/maps: every
    mapping's bounds, then the bounds and path of each executable mapping of a file."""
    all_starts: list[int] = []
    all_ends: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    names: list[str] = []
    # "low-high perms offset dev inode path": the kernel lists mappings by address, sorted.
    for line in os.fsdecode(data).splitlines():
        dash = line.find("-")
        space = line.find(" ", dash)
        if dash <= 0 or space < 0:
            continue
        low, high = int(line[:dash], 16), int(line[dash + 1 : space], 16)
        all_starts.append(low)
        all_ends.append(high)
        if line[space + 3 : space + 4] == "x":
            path = line.find("/", space)
            if path > 0:
                starts.append(low)
                ends.append(high)
                names.append(line[path:])
    return all_starts, all_ends, starts, ends, names


_PT_LOAD, _PF_X = 1, 1


def code_segments(release_gil: bool) -> tuple[tuple[int, int, str], ...]:
    """((start, end, name), ...): each loaded object's executable segments, through ctypes'
    dl_iterate_phdr (name "" for the main program), in load order."""
    import ctypes

    class Phdr(ctypes.Structure):  # Elf64_Phdr / Elf32_Phdr
        _fields_ = (
            (("p_type", ctypes.c_uint32), ("p_flags", ctypes.c_uint32), ("p_offset", ctypes.c_uint64),
             ("p_vaddr", ctypes.c_uint64), ("p_paddr", ctypes.c_uint64), ("p_filesz", ctypes.c_uint64),
             ("p_memsz", ctypes.c_uint64), ("p_align", ctypes.c_uint64))
            if ctypes.sizeof(ctypes.c_void_p) == 8 else
            (("p_type", ctypes.c_uint32), ("p_offset", ctypes.c_uint32), ("p_vaddr", ctypes.c_uint32),
             ("p_paddr", ctypes.c_uint32), ("p_filesz", ctypes.c_uint32), ("p_memsz", ctypes.c_uint32),
             ("p_flags", ctypes.c_uint32), ("p_align", ctypes.c_uint32))
        )

    class Info(ctypes.Structure):
        _fields_ = (
            ("dlpi_addr", ctypes.c_size_t),
            ("dlpi_name", ctypes.c_char_p),
            ("dlpi_phdr", ctypes.POINTER(Phdr)),
            ("dlpi_phnum", ctypes.c_uint16),
        )

    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)
    iterate = (ctypes.PyDLL if not release_gil else ctypes.CDLL)(None).dl_iterate_phdr
    iterate.argtypes = (callback_type, ctypes.c_void_p)
    iterate.restype = ctypes.c_int
    found: list[tuple[int, int, str]] = []

    def visit(info: Any, size: int, data: Any) -> int:
        object_ = info.contents
        name = os.fsdecode(object_.dlpi_name or b"")
        for i in range(object_.dlpi_phnum):
            header = object_.dlpi_phdr[i]
            if header.p_type == _PT_LOAD and header.p_flags & _PF_X and header.p_memsz:
                start = object_.dlpi_addr + header.p_vaddr
                found.append((start, start + header.p_memsz, name))
        return 0

    iterate(callback_type(visit), None)
    return tuple(found)


_linker: Any = None  # ctypes' types and the loader walk, made once per process


def loaded_objects(full: bool, release_gil: bool) -> tuple[tuple[int, int] | None, tuple[str, ...] | None]:
    """``((adds, subs) or None, names or None)``, through ctypes' dl_iterate_phdr (a Python callback)."""
    import ctypes

    global _linker
    if _linker is None:

        class PhdrInfo(ctypes.Structure):
            _fields_ = (  # the fields up to the load counters (glibc >= 2.4), in their C layout
                ("dlpi_addr", ctypes.c_void_p),
                ("dlpi_name", ctypes.c_char_p),
                ("dlpi_phdr", ctypes.c_void_p),
                ("dlpi_phnum", ctypes.c_uint16),
                ("dlpi_adds", ctypes.c_ulonglong),
                ("dlpi_subs", ctypes.c_ulonglong),
            )

        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(PhdrInfo), ctypes.c_size_t, ctypes.c_void_p)
        # (GIL held, GIL released): a PyDLL function keeps the GIL around the call.
        iterate = (ctypes.PyDLL(None).dl_iterate_phdr, ctypes.CDLL(None).dl_iterate_phdr)
        for function in iterate:
            function.argtypes = (callback_type, ctypes.c_void_p)
            function.restype = ctypes.c_int
        _linker = (callback_type, iterate, PhdrInfo.dlpi_subs.offset + ctypes.sizeof(ctypes.c_ulonglong))
    callback_type, iterate, counters_size = _linker
    counters: list[tuple[int, int] | None] = []
    names: list[str] = []

    def visit(info: Any, size: int, data: Any) -> int:
        found = info.contents
        if not counters:
            counters.append((found.dlpi_adds, found.dlpi_subs) if size >= counters_size else None)
        if not full:
            return 1
        if found.dlpi_name:
            names.append(os.fsdecode(found.dlpi_name))
        return 0

    iterate[bool(release_gil)](callback_type(visit), None)
    return (counters[0] if counters else None), (tuple(names) if full else None)


def stop_if_parked(functions: tuple[int, ...], interpreter: tuple[bytes, ...]) -> str | None:
    """Never calls: the check and the calls must hold the GIL throughout, which Python code cannot
    (csrc/parked_threads.c)."""
    return "no native module"
