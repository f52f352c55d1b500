"""OpenBLAS's thread count (``blas_cpu_number``) as a ctypes int, also where a build keeps it private: a worker
lowers it without the setter, which would start the whole pool again
(why: docs/internals.md, ``safeloader.backends.threadpools``)."""

from __future__ import annotations

import platform
from typing import Any

__all__ = ["cpu_number", "private_cpu_number"]


def cpu_number(dynlib: Any, getter: Any) -> Any:
    import ctypes

    try:
        return ctypes.c_int.in_dll(dynlib, "blas_cpu_number")
    except ValueError:  # private in this build (OpenBLAS 0.3.34 in numpy 2.5)
        return private_cpu_number(getter)


def private_cpu_number(getter: Any) -> Any:
    """OpenBLAS's ``blas_cpu_number`` where the build keeps it private, found in ``openblas_get_num_threads``'
    code (x86-64: ``mov eax, [rip + offset]; ret``) and trusted only if it holds what the getter returns."""
    import ctypes

    if platform.machine() != "x86_64":
        return None
    start = ctypes.cast(getter, ctypes.c_void_p).value
    if start is None:
        return None
    try:  # through /proc/self/mem: a read past the end of the code fails here instead of crashing
        with open("/proc/self/mem", "rb", buffering=0) as memory:
            memory.seek(start)
            code = memory.read(64)
    except (OSError, OverflowError):
        return None
    position = code.find(b"\x8b\x05")
    while 0 <= position <= len(code) - 7:
        if code[position + 6] == 0xC3:
            offset = int.from_bytes(code[position + 2 : position + 6], "little", signed=True)
            candidate = ctypes.c_int.from_address(start + position + 6 + offset)
            if candidate.value == getter():
                return candidate
        position = code.find(b"\x8b\x05", position + 1)
    return None
