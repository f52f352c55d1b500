"""Options of the built-in backends: process-wide defaults (``configure``), overridden per loader by the
keywords of the same names; hooks read the resolved values from their ``ForkContext``."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

ZARRS_MODES = ("pool", "serial", "python")
MAX_THREAD_BUDGET = 1024
"""A bound far above any machine's cores: a larger thread_budget is a mistake, not a setting."""
UNSAFE_FORK_POLICIES = ("auto", "raise", "forkserver", "warn", "ignore")
MAX_STALL_TIMEOUT = threading.TIMEOUT_MAX
"""The longest stall_timeout (292 years on Linux): the longest wait a lock or event takes, and
far from the floats whose products (``FIRST_ITEM_FACTOR``, a batch's items) overflow."""


def _shown(value: object) -> str:
    """``repr(value)``, but a huge int by its size: 10**400 has 401 digits, and past 4300
    ``repr`` itself raises (``sys.set_int_max_str_digits``)."""
    if isinstance(value, int) and value.bit_length() > 128:
        sign = "a negative" if value < 0 else "an"
        return f"{sign} int of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return repr(value)


def hook_names(value: object) -> tuple[str, ...]:
    """``disable_hooks`` as given (any iterable of names, a generator included) as a tuple,
    read once: kept as given, a one-shot iterator would be empty at every later read."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"disable_hooks must be an iterable of hook names, got {value!r}")
    names = tuple(value)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"disable_hooks must be an iterable of hook names (str), got {names!r}")
    return names


def _check_stall_timeout(timeout: object) -> float | None:
    """``stall_timeout`` as a float (None: off), or ValueError naming the option. Compared before
    ``float()``: an int past the floats' range (10**400) overflows there, not naming the option."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise _bad_stall_timeout(timeout, "")
    if not 0 < timeout <= MAX_STALL_TIMEOUT:  # `not` also refuses NaN, which compares false with everything
        too_large = timeout > MAX_STALL_TIMEOUT
        raise _bad_stall_timeout(timeout, f": too large (at most {MAX_STALL_TIMEOUT:.0f})" if too_large else "")
    return float(timeout)


def _bad_stall_timeout(timeout: object, why: str) -> ValueError:
    return ValueError(
        f"stall_timeout must be None (off) or a finite number of seconds > 0, got {_shown(timeout)}{why}"
    )


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_thread_budget(num_workers: int) -> int:
    """Threads per worker when no ``thread_budget`` is set: cores // num_workers, at least 1."""
    return max(1, available_cores() // max(1, num_workers))


@dataclass(frozen=True)
class Options:
    zarrs_mode: str = "pool"
    """How workers decode zarrs arrays: "pool" (a fresh Rust thread pool per
    worker), "serial" (Rust codec on the calling thread) or "python"
    (zarr-python's own pipeline)."""
    thread_budget: int | None = None
    """Threads each worker may give a BLAS/OpenMP pool; None: cores // num_workers."""
    freeze_gc: bool = True
    """Freeze the parent's GC-tracked objects around worker forks, so that the
    workers' garbage collections do not copy their pages (measured: a worker's
    full collection over 2M records copied 243 MiB without, 0 with; O(1) cost)."""
    stall_timeout: float | None = 60.0
    """Seconds a busy worker may go without finishing an item before the loader raises; None: off.
    Progress is counted per item and idle workers never stall, so this bounds one item's fetch;
    a worker's start and first item get twice as long (``watchdog.FIRST_ITEM_FACTOR``)."""
    disable_hooks: frozenset[str] = frozenset()
    """Names of hooks (built-in backends included) not to run."""
    on_unsafe_fork: str = "auto"
    """What a loader that would fork does when the parent holds live native threads that no backend
    resets and that are not known to survive fork (any library's pool: ``native_libraries``):
    "auto" (start those workers with a preloaded forkserver when the Dataset pickles, with an
    ``UnsafeForkWarning`` saying why; otherwise raise ``UnsafeForkError``), "raise" (raise
    ``UnsafeForkError`` naming the library and the remedies, before any worker starts),
    "forkserver" (always switch), "warn" (fork, with an ``UnsafeForkWarning``) or "ignore"
    (fork, silently: the workers never use that library)."""

    def threads_per_worker(self, num_workers: int) -> int:
        """The thread budget of each of ``num_workers`` workers: ``thread_budget``, or the default."""
        return self.thread_budget if self.thread_budget is not None else default_thread_budget(num_workers)

    def __post_init__(self) -> None:
        if self.zarrs_mode not in ZARRS_MODES:
            raise ValueError(f"zarrs_mode must be one of {ZARRS_MODES}, got {self.zarrs_mode!r}")
        budget = self.thread_budget
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_THREAD_BUDGET
        ):
            raise ValueError(
                f"thread_budget must be None or an int from 1 to {MAX_THREAD_BUDGET}, got {_shown(budget)}"
            )
        if not isinstance(self.freeze_gc, bool):
            raise TypeError(f"freeze_gc must be a bool, got {self.freeze_gc!r}")
        object.__setattr__(self, "stall_timeout", _check_stall_timeout(self.stall_timeout))
        if self.on_unsafe_fork not in UNSAFE_FORK_POLICIES:
            raise ValueError(f"on_unsafe_fork must be one of {UNSAFE_FORK_POLICIES}, got {self.on_unsafe_fork!r}")
        object.__setattr__(self, "disable_hooks", frozenset(hook_names(self.disable_hooks)))

    def as_dict(self) -> dict[str, object]:
        """The options as plain data (``disable_hooks`` a sorted list), for reports."""
        values = {name: getattr(self, name) for name in OPTION_NAMES}
        values["disable_hooks"] = sorted(self.disable_hooks)
        return values

    def replace(self, **changes: object) -> Options:
        """A copy with ``changes`` applied; unknown names are a TypeError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown safeloader option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


OPTION_NAMES: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Options))
"""Every option, in declaration order: ``SafeDataLoader``'s keywords and attributes of these names."""

_defaults = Options()  # module state: configure() sets the process's defaults


def get_options() -> Options:
    """The process-wide defaults in force."""
    return _defaults


def set_defaults(options: Options) -> Options:
    """Make ``options`` the process-wide defaults (``safeloader.configure``); returns the previous ones."""
    global _defaults
    if not isinstance(options, Options):
        raise TypeError(f"options must be a safeloader.Options, got {options!r}")
    previous, _defaults = _defaults, options
    return previous
