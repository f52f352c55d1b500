"""A Dataset using a C thread pool no backend knows (tests/native/tiny_pool.c, like DuckDB's, blosc2's
or FFmpeg's), started and used once in the parent; 2 workers read 6 items through it.

argv: the built library, ``torch`` or ``safeloader`` (whose DataLoader), an ``on_unsafe_fork``
policy (``default``: not passed; ``missed``: default, the pool's threads not found at the start;
``backend``: default, with a backend of the test's own that resets the pool in each worker;
``claimed``: default, with a backend that declares the library and does nothing; ``survives``:
default, with a table row saying the library survives fork),
and ``pickles`` or ``unpicklable`` (the Dataset also holds a lock, as one holding an open
connection would). Prints the items, or the error's type and message,
then each warning's category and message.
"""

import ctypes
import sys
import threading
import time
import warnings

import torch

import safeloader

library, which, policy, kind = sys.argv[1:]


def pool() -> ctypes.CDLL:
    lib = ctypes.CDLL(library)
    lib.pool_start(2)  # starts the pool's threads once per process: a forked child has none
    return lib


class SquaresThroughThePool(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.lock = threading.Lock() if kind == "unpicklable" else None

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> int:
        return pool().pool_square(index)


if __name__ == "__main__":  # forkserver workers import this file as __mp_main__
    assert pool().pool_square(3) == 9  # the parent's pool is live
    if policy == "missed":  # as on a loaded machine, where the pool's threads still ran at the start
        import safeloader.diagnostics.thread_owners

        found_at_start = safeloader.diagnostics.thread_owners.live_libraries
        safeloader.diagnostics.thread_owners.live_libraries = lambda *args: {}

        def restore(*args: object) -> None:
            safeloader.diagnostics.thread_owners.live_libraries = found_at_start

        safeloader.register_at_fork(after_in_parent=restore, name="restore")
        policy = "default"
    if policy == "claimed":  # a backend declares the library (Backend.libraries) but leaves its pool as it is

        class ClaimingBackend(safeloader.Backend):
            name = "claims-tinypool"
            description = "declares the tiny pool handled, and does nothing to it"
            libraries = ("libtinypool",)

            def after_in_child(self, plan: None) -> None:
                pass  # as a backend whose limit the library itself undoes on its next call

        safeloader.register_backend(ClaimingBackend)
        policy = "default"
    if policy == "survives":  # a table row says the library survives fork: it does not
        from safeloader.diagnostics import native_libraries

        native_libraries.KNOWN += (native_libraries.Known(("libtinypool",), native_libraries.SURVIVES, "(wrong)"),)
        policy = "default"
    if policy == "backend":

        class TinyPoolBackend(safeloader.Backend):
            name = "tinypool"
            description = "each worker starts the tiny pool's threads afresh"
            libraries = ("libtinypool",)

            def after_in_child(self, plan: None) -> None:
                pool().pool_forget_threads()  # the next call starts the worker's own threads

        safeloader.register_backend(TinyPoolBackend)
        policy = "default"
    keywords = {} if policy == "default" or which == "torch" else {"on_unsafe_fork": policy}
    loader_class = torch.utils.data.DataLoader if which == "torch" else safeloader.DataLoader
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            started = time.monotonic()  # from the loader's creation: the time to the named error
            loader = loader_class(SquaresThroughThePool(), batch_size=None, num_workers=2, **keywords)
            print(sorted(int(x) for x in loader), flush=True)
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}", flush=True)
            print(f"error after {time.monotonic() - started:.1f} s", file=sys.stderr)
    for warning in caught:
        if issubclass(warning.category, DeprecationWarning) and "multi-threaded" in str(warning.message):
            continue  # Python 3.12+ on any fork with live threads: torch's loader gets it too
        print(f"{warning.category.__name__}: {warning.message}")
