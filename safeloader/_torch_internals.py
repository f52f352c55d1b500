"""Every private name of torch (and multiprocessing) that safeloader relies on, in one place.

safeloader wraps torch's public entry points, but recognising a worker fork,
watching a worker and shutting one down need a few private names. They are
named here, probed once at the first worker start (``check``), and a missing
one is reported with what stops working, instead of safeloader running
unarmed in silence.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from dataclasses import dataclass

WORKER_LOOP_NAMES = ("_worker_loop", "_process_worker_loop")
"""torch's worker entry point: ``_worker_loop`` up to 2.15; torch's main branch splits it
into ``_process_worker_loop`` (process workers) and ``_base_worker_loop`` (shared with
thread workers)."""
WORKER_LOOP_MODULES = ("torch.utils.data", "torchdata")
"""Modules whose worker loops start DataLoader workers (torchdata has its own copy)."""
THREAD_WORKER_ATTRIBUTE = "worker_method"
"""The DataLoader argument of torch's thread-based workers (``worker_method="thread"``)."""


@dataclass(frozen=True)
class Internal:
    module: str
    path: str
    """Attribute path inside ``module``."""
    used_for: str


INTERNALS = (
    Internal("torch.utils.data.dataloader", "DataLoader._get_iterator", "arming a loader's worker start"),
    Internal("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter._try_get_data", "the stall watchdog"),
    Internal("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter._shutdown_workers", "shutting down"),
    Internal("torch.utils.data.dataloader", "_DatasetKind.create_fetcher", "per-item progress in workers"),
    Internal("torch.utils.data._utils.pin_memory", "pin_memory", "the pin-memory fork gate"),
    Internal("torch.utils.data._utils.signal_handling", "_remove_worker_pids", "killing a stalled worker quietly"),
    Internal("multiprocessing.popen_fork", "Popen._launch", "recognising a DataLoader worker fork"),
)


def _resolve(internal: Internal) -> object | None:
    try:
        value: object = importlib.import_module(internal.module)
    except ImportError:
        return None
    for part in internal.path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def has_worker_loop() -> bool:
    """Whether this torch has a worker loop safeloader recognises."""
    from torch.utils.data._utils import worker

    return any(hasattr(worker, name) for name in WORKER_LOOP_NAMES)


@functools.cache
def missing() -> tuple[str, ...]:
    """What this torch lacks of what safeloader relies on, one line each (empty: all there)."""
    lines = [
        f"{internal.module}.{internal.path} (used for {internal.used_for})"
        for internal in INTERNALS
        if _resolve(internal) is None
    ]
    if not has_worker_loop():
        lines.append(f"torch.utils.data._utils.worker.{' or '.join(WORKER_LOOP_NAMES)} (recognising worker forks)")
    return tuple(lines)


_checked = False


def check() -> None:
    """At the first armed worker start: warn once, loudly, if this torch lacks a name safeloader relies on."""
    global _checked
    if _checked:
        return
    _checked = True
    lines = missing()
    if lines:
        import torch

        warnings.warn(
            f"safeloader does not know this torch ({torch.__version__}): it lacks "
            + "; ".join(lines)
            + ". What depends on these does not run. Please report this torch version to safeloader.",
            RuntimeWarning,
            stacklevel=4,
        )


def is_worker_loop(target: object) -> bool:
    """Whether ``target`` (a Process's target) is a DataLoader worker loop."""
    module = getattr(target, "__module__", "") or ""
    return getattr(target, "__name__", "") in WORKER_LOOP_NAMES and module.startswith(WORKER_LOOP_MODULES)


def uses_thread_workers(loader: object) -> bool:
    return getattr(loader, THREAD_WORKER_ATTRIBUTE, None) == "thread"
