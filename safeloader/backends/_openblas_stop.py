"""OpenBLAS's ``blas_thread_shutdown_`` (what its own fork handler runs in the parent at every fork) as a
ctypes function, also where a build keeps it private: scipy-openblas 0.3.34 in numpy 2.5 exports neither
it nor a prefixed name, and the earlier lookup by exported name found nothing there (its threads were
then waited for at every start: issue 43). Such a file's own symbol table (``.symtab``) still names it.
Why it is called at all: ``_blas_pools.stop_openblas_servers``."""

from __future__ import annotations

import os
import struct
from typing import Any

from .. import native

__all__ = ["ServerStop", "private_copy", "stop_while_parked"]

_SHUTDOWN = "blas_thread_shutdown_"


def private_copy(real: str) -> bool:
    """Whether the OpenBLAS at ``real`` (a real path) is a copy only Python extension modules call: one
    vendored in a wheel (auditwheel's ``<distribution>.libs``, its name made unique by a hash) or a
    scipy-openblas build (built for numpy and scipy, every symbol renamed). Not torch's (its aarch64
    wheels bundle OpenBLAS): torch's own native pools (interop tasks) call BLAS with no Python thread,
    and the caller of the stop only knows about Python threads."""
    directory = os.path.basename(os.path.dirname(real))
    if directory == "torch.libs":
        return False
    return directory.endswith(".libs") or os.path.basename(real).startswith("libscipy_openblas")


class ServerStop:
    """``blas_thread_shutdown_`` of one loaded OpenBLAS, looked up at its first call (the file's symbol
    table is read only in a process where a start found that pool's threads spinning)."""

    def __init__(self, dynlib: Any, path: str, anchors: tuple[str, str]) -> None:
        self._dynlib = dynlib
        self._path = path
        self._anchors = anchors  # two exported names: where the file's symbol table is placed in memory
        self._function: Any = None
        self._looked = False

    def function(self) -> Any:
        """The C function, or None where neither the exports nor the file's symbol table name it."""
        if not self._looked:
            self._looked = True
            self._function = _exported(self._dynlib) or _private(self._dynlib, self._path, self._anchors)
        return self._function

    def address(self) -> int | None:
        """Where the C function lies, or None where it is not found."""
        import ctypes

        function = self.function()
        return None if function is None else ctypes.cast(function, ctypes.c_void_p).value

    def __call__(self) -> bool:
        """Its threads told to exit and joined (the next BLAS call starts them again); False if not found."""
        function = self.function()
        if function is None:
            return False
        function()
        return True


def stop_while_parked(stops: list[ServerStop]) -> int:
    """Each of ``stops`` called where another Python thread lives, but only while none can be inside
    these copies nor enter them before the stop ends: every other Python thread blocked in a system
    call with return addresses only into the interpreter's code (``native.stop_if_parked``, which
    checks and stops holding the GIL throughout; why that suffices: docs/internals.md, threadpools).
    Idle threads waiting on a lock or a queue are such threads; one in a BLAS call has numpy's (or
    scipy's) return addresses on its stack. Returns how many copies were stopped (0: none, as before)."""
    addresses = tuple(address for address in (stop.address() for stop in stops) if address)
    if not addresses or native.stop_if_parked(addresses, _interpreter_code()) is not None:
        return 0
    return len(addresses)


_interpreter: tuple[bytes, ...] | None = None  # module state: the interpreter's own files, found once


def _interpreter_code() -> tuple[bytes, ...]:
    """The files whose code only returns to the eval loop (or into the C runtime) when a parked
    thread's system call returns: the Python binary, libpython, libc and libpthread as loaded here,
    and the stdlib's lib-dynload directory (its modules call Python code only holding the GIL). Not
    the dynamic loader: a thread inside dlopen goes on to run the new object's constructors."""
    global _interpreter
    if _interpreter is None:
        import sysconfig

        from .. import _loader_lock

        names = {os.path.realpath(name) for _, _, name in _loader_lock.section(native.code_segments)
                 if name.startswith("/")}
        found = {os.readlink("/proc/self/exe")}
        found.update(name for name in names
                     if os.path.basename(name).startswith(("libpython", "libc.so", "libc-", "libpthread")))
        dynload = os.path.realpath(os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload"))
        _interpreter = (*sorted(os.fsencode(name) for name in found), os.fsencode(dynload + "/"))
    return _interpreter


def _exported(dynlib: Any) -> Any:
    import ctypes

    function = getattr(dynlib, _SHUTDOWN, None)  # exported unprefixed by scipy-openblas up to numpy 2.4
    return None if function is None else _holding_the_gil(ctypes.cast(function, ctypes.c_void_p).value)


def _holding_the_gil(address: Any) -> Any:
    """The C function at ``address``, called without releasing the GIL: no Python thread can start
    (and call BLAS) between the caller's check that it is the only one and the threads' exit."""
    import ctypes

    return ctypes.PYFUNCTYPE(ctypes.c_int)(address)


def _private(dynlib: Any, path: str, anchors: tuple[str, str]) -> Any:
    """The private function at its address: the symbol table's value plus where the object is loaded,
    which two exported functions must both give (a file replaced on disk since the load gives none)."""
    import ctypes

    try:
        values = symbol_values(path, (_SHUTDOWN, *anchors))
    except (OSError, struct.error, ValueError):
        return None
    if len(values) != 3:
        return None
    bases = set()
    for name in anchors:
        exported = getattr(dynlib, name, None)
        if exported is None:
            return None
        bases.add(ctypes.cast(exported, ctypes.c_void_p).value - values[name])  # type: ignore[operator]
    if len(bases) != 1:
        return None
    # Its address is taken by OpenBLAS's own pthread_atfork call: it keeps the C calling convention.
    return _holding_the_gil(bases.pop() + values[_SHUTDOWN])


_SHT_SYMTAB = 2
_STT_FUNC = 2
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section, value, size


def symbol_values(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """Value (offset from the load address) of each defined function of ``names`` in the ``.symtab`` of
    the 64-bit little-endian ELF file at ``path``; a name not there (or a stripped file) is left out."""
    with open(path, "rb", buffering=0) as file:
        header = os.pread(file.fileno(), 64, 0)
        if header[:4] != b"\x7fELF" or header[4:6] != b"\x02\x01":
            return {}
        (section_offset,) = struct.unpack_from("<Q", header, 0x28)
        entry_size, count = struct.unpack_from("<HH", header, 0x3A)
        sections = os.pread(file.fileno(), entry_size * count, section_offset)

        def extent(index: int) -> tuple[int, int, int]:
            offset, size, link = struct.unpack_from("<QQI", sections, index * entry_size + 0x18)
            return offset, size, link

        symtab = next((i for i in range(count)
                       if struct.unpack_from("<I", sections, i * entry_size + 4)[0] == _SHT_SYMTAB), None)
        if symtab is None:
            return {}
        offset, size, link = extent(symtab)
        table = os.pread(file.fileno(), size, offset)
        string_offset, string_size, _ = extent(link)
        strings = os.pread(file.fileno(), string_size, string_offset)
    values = {}
    for name in names:
        value = _defined_function(table, strings, name.encode())
        if value is not None:
            values[name] = value
    return values


def _defined_function(table: bytes, strings: bytes, name: bytes) -> int | None:
    """The value of the defined function called ``name``: its possible string offsets (a linker may
    share a tail of a longer name), then the symbol entries that name one, searched at C speed."""
    position = strings.find(name + b"\0")
    while position >= 0:
        key = struct.pack("<I", position)
        at = table.find(key)
        while at >= 0:
            if at % _SYMBOL.size == 0:
                _, info, _, section, value, _ = _SYMBOL.unpack_from(table, at)
                if info & 0xF == _STT_FUNC and section != 0:
                    return int(value)
            at = table.find(key, at + 1)
        position = strings.find(name + b"\0", position + 1)
    return None
