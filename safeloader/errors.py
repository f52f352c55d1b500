"""Exceptions raised by safeloader, and the stall watchdog's ``WorkerStoppedWarning``."""

from __future__ import annotations

import errno
from typing import Any


class HookError(RuntimeError):
    """A fork hook raised: names the hook, the phase and (in a worker) the worker id; the hook's exception is
    its ``__cause__`` in the parent, its traceback text when it comes through torch's worker error path."""

    def __init__(
        self,
        message: str,
        *,
        hook: str | None = None,
        phase: str | None = None,
        worker_id: int | None = None,
    ) -> None:
        # One positional argument only: torch re-raises worker errors as
        # ``type(exc)(message)``, which must keep working.
        super().__init__(message)
        self.hook = hook
        self.phase = phase
        self.worker_id = worker_id


class RegistrationError(ValueError):
    """A hook was registered with bad arguments or under a name already taken."""


class UnsafeForkError(RuntimeError):
    """Workers would be forked from a process holding a native thread pool that nothing resets; raised before
    any worker starts, naming the library and the remedies (``libraries``). See ``on_unsafe_fork``."""

    def __init__(self, message: str, *, libraries: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.libraries = libraries


class WorkerStallError(RuntimeError):
    """A DataLoader worker made no progress for ``stall_timeout`` seconds: ``worker_id`` the first stalled,
    ``reports`` a ``StallReport`` (stacks, likely cause) per stalled worker."""

    def __init__(self, message: str, *, worker_id: int | None = None, reports: tuple[Any, ...] = ()) -> None:
        super().__init__(message)  # one positional argument, like every safeloader error
        self.worker_id = worker_id
        self.reports = reports
        self.details = ""
        """Every stack collected, all threads, Python and native."""


class WorkerStoppedWarning(RuntimeWarning):
    """A DataLoader worker with work to do has been stopped (``SIGSTOP``, or held by a debugger)
    for longer than its ``stall_timeout`` while the main process runs: the loader waits for it.
    A stopped worker is never reported as stalled; this says why the loader is waiting."""


def out_of_descriptors_hint(exc: BaseException) -> str:
    """A sentence to add to an error caused by running out of file descriptors, else ''."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return (
            ". The process ran out of file descriptors: raise the limit with `ulimit -n` in the shell "
            "(or resource.setrlimit(resource.RLIMIT_NOFILE, ...)), or use fewer workers"
        )
    return ""


# Raised or warned by one backend or step; importable from there too.


class UnarmedWorkersError(RuntimeError):
    """A safeloader loader started workers that no fork hook could recognise."""


class PolarsInheritedObjectError(RuntimeError):
    """A polars object built in the parent cannot be used in a forked DataLoader worker."""


class PolarsForkError(RuntimeError):
    """polars cannot be made safe in this forked worker."""


class ZarrsFallbackWarning(RuntimeWarning):
    """The requested zarrs mode cannot be set up; workers use a slower one."""


class WritableFileWarning(UserWarning):
    """An HDF5 file open for writing in the parent while DataLoader workers fork."""


class ForkedAcceleratorError(RuntimeError):
    """A forked DataLoader worker used an accelerator the parent had initialised."""


class SharedFileWarning(RuntimeWarning):
    """A DataLoader worker could not get its own description of an inherited
    file: it reads through the parent's, with the offset shared, as under torch."""


class Blosc2PoolError(RuntimeError):
    """blosc2's threads could not be stopped before a DataLoader worker fork."""


class LmdbWritableError(RuntimeError):
    """A Dataset holds an LMDB environment open for writing while forked workers start."""


class ZarrsStoreError(RuntimeError):
    """zarrs cannot read this array's store in a forked worker with the mode in force."""


class UnsafeForkWarning(RuntimeWarning):
    """Workers are forked from (or, to avoid that, not forked from) a parent holding a pool that no
    safeloader backend resets."""
