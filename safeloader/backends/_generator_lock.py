"""torch's default CPU generator's lock, left held in a forked worker by a parent thread that was drawing random
numbers at the fork, made new there (why: docs/internals.md, ``safeloader.backends.torch_state``)."""

from __future__ import annotations

import sys
import threading
from typing import Any

_OBJECT_HEAD = 16  # PyObject_HEAD: the THPGenerator's at::Generator (one pointer) follows it
_MUTEX_OFFSET = 16  # in GeneratorImpl: vtable pointer, then the reference counts (8 bytes)
_MUTEX_SIZE = 40  # glibc's pthread_mutex_t on 64-bit Linux
_CPU_DEVICE = b"\x00\xff"  # c10::Device(kCPU, -1), right after the mutex


def _mutex_address(ctypes: Any, generator: Any) -> int | None:
    impl = ctypes.c_void_p.from_address(id(generator) + _OBJECT_HEAD).value
    return impl + _MUTEX_OFFSET if impl else None


def _layout_known(ctypes: Any, torch: Any) -> bool:
    if ctypes.sizeof(ctypes.c_void_p) != 8 or not sys.platform.startswith("linux"):
        return False
    fresh = torch.Generator()  # its mutex is unlocked: nobody else has it
    address = _mutex_address(ctypes, fresh)
    if address is None:
        return False
    raw = ctypes.string_at(address, _MUTEX_SIZE + len(_CPU_DEVICE))
    return raw[:_MUTEX_SIZE] == bytes(_MUTEX_SIZE) and raw[_MUTEX_SIZE:] == _CPU_DEVICE


class DefaultGeneratorLock:
    """torch's default CPU generator's mutex, found once in the parent (the torch backend's ``before``):
    each worker inherits the answer."""

    def __init__(self) -> None:
        self._found: tuple[int | None] | None = None  # (the mutex's address or None), once found

    def address(self) -> int | None:
        """The mutex's address; None where torch is not imported or its layout is not the one checked for."""
        if self._found is None:
            torch = sys.modules.get("torch")
            generator = getattr(torch, "default_generator", None)
            if generator is None:
                return None  # torch not imported (yet): asked again later
            import ctypes

            self._found = (_mutex_address(ctypes, generator) if _layout_known(ctypes, torch) else None,)
        return self._found[0]

    def release_abandoned(self) -> bool:
        """In a forked child: make the lock new if a thread the child does not have holds it. True when it did."""
        address = self.address()
        if address is None:
            return False
        import ctypes

        lock = ctypes.c_int.from_address(address).value  # __lock
        owner = ctypes.c_int.from_address(address + 8).value  # __owner: the holder's thread id
        if lock == 0 or owner in (0, threading.get_native_id()):
            return False
        ctypes.memset(address, 0, _MUTEX_SIZE)  # PTHREAD_MUTEX_INITIALIZER
        return True
