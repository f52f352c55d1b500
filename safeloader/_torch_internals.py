"""Every private name of torch (and multiprocessing) that safeloader relies on, in one place, probed
once at the first worker start (docs/internals.md, ``safeloader._torch_internals``)."""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

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


_checked = False  # module state: once per process, as torch's names do not change while it runs


def check() -> None:
    """At the first armed worker start: warn once, loudly, if this torch lacks a name safeloader relies on."""
    global _checked
    if _checked:
        return
    _checked = True
    worker = sys.modules.get("torch.utils.data._utils.worker")
    for name in WORKER_LOOP_NAMES:  # read its parameters now, not during the first fork
        loop = getattr(worker, name, None)
        if loop is not None:
            worker_argument_positions(loop)
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


# -- accessors: the only code that touches the private names above -------------------

PIN_MEMORY_MODULE = "torch.utils.data._utils.pin_memory"
"""Where torch's pin-memory thread's ``pin_memory`` function lives (the pin-memory fork gate wraps it)."""
PIN_MEMORY_LOOP = "_pin_memory_loop"
"""The target of torch's pin-memory thread (in ``PIN_MEMORY_MODULE``)."""
ACCELERATORS = ("cuda", "xpu")
"""torch's accelerator modules whose state a forked child cannot use."""


def initialised_accelerators() -> tuple[str, ...]:
    """Accelerators torch has initialised in this process ("cuda", "xpu"); nothing is imported."""
    names = []
    for name in ACCELERATORS:
        module = sys.modules.get(f"torch.{name}")
        if module is not None and module.is_initialized():
            names.append(name)
    return tuple(names)


def pin_memory_threads() -> list[threading.Thread]:
    """The live pin-memory threads of torch's loaders in this process, but the calling thread."""
    me = threading.current_thread()
    return [
        thread
        for thread in threading.enumerate()
        if thread is not me
        and thread.is_alive()
        and getattr(getattr(thread, "_target", None), "__name__", "") == PIN_MEMORY_LOOP
    ]


def start_method(context: Any = None) -> str:
    """The start method torch's loader uses with ``multiprocessing_context=context``."""
    import torch.multiprocessing

    return (context or torch.multiprocessing.get_context()).get_start_method()


def fork_is_default() -> bool:
    """Whether torch would fork workers when given no context (False on 3.14+)."""
    return start_method() == "fork"


def safeloader_start_method(context: Any = None) -> str:
    """The start method a safeloader loader with ``multiprocessing_context=context`` uses: on Linux,
    fork unless a context or a process-wide start method was set (torch's default otherwise)."""
    import torch.multiprocessing

    if context is None and sys.platform.startswith("linux") and torch.multiprocessing.get_start_method(
        allow_none=True
    ) is None:
        return "fork"
    return start_method(context)


LAZY_INIT = "_lazy_init"
"""An accelerator module's (``torch.cuda``...) initialisation on first use, refused in forked workers."""
GET_ITERATOR = "_get_iterator"
"""DataLoader's method that creates the iterator, which is where torch forks the workers."""
TRY_GET_DATA = "_try_get_data"
"""The multiprocessing iterator's wait for one batch (with a timeout), wrapped by the watchdog."""
SHUTDOWN_WORKERS = "_shutdown_workers"
"""The multiprocessing iterator's shutdown of its workers, followed by the watchdog's own end."""


def get_iterator_of(cls: type) -> Any:
    """``cls``'s own ``_get_iterator`` (KeyError if it only inherits one)."""
    return cls.__dict__[GET_ITERATOR]


def set_get_iterator(cls: type, method: Any) -> None:
    setattr(cls, GET_ITERATOR, method)


def has_workers_to_watch(iterator: object) -> bool:
    """Whether ``iterator`` is a multiprocessing iterator whose wait and workers safeloader knows."""
    return hasattr(type(iterator), TRY_GET_DATA) and hasattr(iterator, "_workers")


def worker_processes(iterator: Any) -> list[Any]:
    """The iterator's worker processes, by worker id."""
    return list(getattr(iterator, "_workers", ()))


def workers_awaited(iterator: Any) -> frozenset[int]:
    """Ids of the workers the iterator sent a batch's indices to and has no batch back from: the
    loader waits, or will, for each (torch's ``_task_info``: send index -> (worker id,) until the
    batch comes back, then (worker id, data) or removed)."""
    # list(): copied at once (the GIL held), as another thread of the parent may ask while torch's changes it
    return frozenset(info[0] for info in list(getattr(iterator, "_task_info", {}).values()) if len(info) == 1)


def shutdown_workers(iterator: Any) -> None:
    """torch's own orderly shutdown of the iterator's workers (joins them, closes the queues)."""
    shutdown = getattr(iterator, SHUTDOWN_WORKERS, None)
    if shutdown is not None:
        shutdown()


def forget_worker_pids(iterator: Any) -> None:
    """Unregister the iterator's workers from torch's SIGCHLD handler (killing one is then not reported)."""
    from torch.utils.data._utils import signal_handling

    try:
        signal_handling._remove_worker_pids(id(iterator))
    except (ValueError, RuntimeError):  # none registered
        pass
    iterator._worker_pids_set = False


def dataset_kind() -> Any:
    """torch's ``_DatasetKind`` (its ``create_fetcher`` builds the worker's fetcher), or None."""
    from torch.utils.data import dataloader

    return getattr(dataloader, "_DatasetKind", None)


def wrap_create_fetcher(wrap: Callable[[Any], Any]) -> bool:
    """Pass every fetcher torch's worker loop creates through ``wrap``, once per process (inherited by
    workers); False where this torch has no such factory."""
    kind = dataset_kind()
    original = getattr(kind, "create_fetcher", None) if kind is not None else None
    if original is None:
        return False
    if getattr(original, "_safeloader_wrapped", False):
        return True

    def create_fetcher(*args: Any, **kwargs: Any) -> Any:
        return wrap(original(*args, **kwargs))

    create_fetcher._safeloader_wrapped = True  # type: ignore[attr-defined]
    kind.create_fetcher = staticmethod(create_fetcher)
    return True


def is_map_fetcher(fetcher: object) -> bool:
    """Whether ``fetcher`` is torch's map-style fetcher, which indexes its ``dataset`` attribute."""
    return type(fetcher).__name__ == "_MapDatasetFetcher" and hasattr(fetcher, "dataset")


Wait = Callable[[Any, Callable[[float], tuple[bool, Any]], float], tuple[bool, Any]]
"""``wait(iterator, torch_wait, timeout)``: waits for one batch, calling ``torch_wait(seconds)``."""


def waiting_with(cls: type, wait: Wait, module: str,
                 explain: Callable[[Any, RuntimeError], RuntimeError | None],
                 shut_down: Callable[[Any], None]) -> type:
    """A subclass of torch's multiprocessing iterator class ``cls`` whose wait for one batch is ``wait``
    (around torch's), whose ``__next__`` raises ``explain(iterator, error)`` for a RuntimeError, and
    whose workers' shutdown (torch's: an epoch's end, an error, the iterator collected) is followed
    by ``shut_down(iterator)``."""
    torch_wait = getattr(cls, TRY_GET_DATA)
    torch_next = cls.__next__  # type: ignore[attr-defined]
    torch_shutdown = getattr(cls, SHUTDOWN_WORKERS)

    def shutdown_workers(self: Any) -> None:
        try:
            torch_shutdown(self)
        finally:
            shut_down(self)

    def try_get_data(self: Any, timeout: float = 5.0) -> tuple[bool, Any]:  # torch's default interval
        return wait(self, lambda seconds: torch_wait(self, seconds), timeout)

    def next_batch(self: Any) -> Any:
        try:
            return torch_next(self)
        except RuntimeError as error:
            explained = explain(self, error)
            if explained is None:
                raise
            raise explained from error

    return type(f"Watched{cls.__name__}", (cls,), {
        TRY_GET_DATA: try_get_data, "__next__": next_batch, SHUTDOWN_WORKERS: shutdown_workers, "__module__": module,
    })


def result_queue_of_worker_loop(frame: Any) -> Any:
    """The result queue of torch's worker loop, from its frame (it calls ``worker_init_fn``), or None."""
    return frame.f_locals.get("data_queue") if frame is not None else None


# -- which fork launches a DataLoader worker? -------------------------------------------

@functools.cache
def _worker_signature(target: Callable[..., Any]) -> inspect.Signature | None:
    return inspect.signature(target) if is_worker_loop(target) else None


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@functools.cache
def worker_argument_positions(target: Callable[..., Any]) -> tuple[int, int, int, int] | None:
    """(index of worker_id, index of num_workers, fewest and most arguments) of a worker loop whose
    parameters are all positional; None for other loops."""
    signature = _worker_signature(target)
    if signature is None:
        return None
    parameters = list(signature.parameters.values())
    names = [p.name for p in parameters]
    if any(p.kind not in _POSITIONAL for p in parameters) or not {"worker_id", "num_workers"} <= set(names):
        return None
    required = sum(p.default is inspect.Parameter.empty for p in parameters)
    return names.index("worker_id"), names.index("num_workers"), required, len(parameters)


def _worker_arguments(process: Any, signature: inspect.Signature) -> tuple[int, int]:
    """(worker_id, num_workers) from the Process's arguments; raises TypeError, KeyError or
    ValueError where they do not fit the loop's signature."""
    args, kwargs = process._args, process._kwargs
    positions = worker_argument_positions(process._target)
    if positions is not None and not kwargs and positions[2] <= len(args) <= positions[3]:
        worker, workers = positions[0], positions[1]
        if worker < len(args) and workers < len(args):  # else a default applies: bind finds it
            return int(args[worker]), int(args[workers])
    arguments = signature.bind(*args, **kwargs).arguments
    return int(arguments["worker_id"]), int(arguments["num_workers"])


def launching_worker() -> tuple[int, int, Any, FrameType] | None:
    """(worker_id, num_workers, multiprocessing's Popen, its ``_launch`` frame) if this fork launches a
    DataLoader worker: read from ``Popen._launch``'s frame, a bounded walk up the stack."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        process = frame.f_locals.get("process_obj") if frame.f_code.co_name == "_launch" else None
        if process is not None:
            target = getattr(process, "_target", None)
            signature = _worker_signature(target) if target is not None else None
            if signature is None:
                return None
            try:
                return (*_worker_arguments(process, signature), frame.f_locals.get("self"), frame)
            except (TypeError, KeyError, ValueError):
                return None
        frame = frame.f_back
    return None
