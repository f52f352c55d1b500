"""The "pin_memory" backend: no worker fork while a pin-memory thread is inside native code
(why: docs/internals.md)."""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from .. import _context, hook_names
from .._context import ForkContext
from .._hooks import FastFork
from .._options import Options
from .._torch_internals import PIN_MEMORY_MODULE
from ._backend import Backend, Hazard

NAME = "pin_memory"
WAIT_SECONDS = 30.0
"""How long a fork waits for pin-memory calls in progress; then it forks anyway, with a warning."""

__all__ = ["BACKEND", "NAME", "WAIT_SECONDS", "gated", "remove_gate", "status"]


class _Gate:
    """Counts threads inside pin_memory(); a fork closes it and waits for zero."""

    def __init__(self) -> None:
        # Held with `with self.lock`, never `with self.condition`: Condition.__enter__ is Python
        # code, where Ctrl-C landing after the acquire leaves the lock held for good (every later
        # fork and pin call would wait on it); a C lock's `with` cannot be cut between the two.
        self.lock = threading.Lock()
        self.condition = threading.Condition(self.lock)
        self.inside = 0
        # Forks under way, per forking thread (ident -> count): two loaders may
        # start workers from two threads at once; the gate opens when both are done.
        self.closers: dict[int, int] = {}
        self.local = threading.local()  # .depth: pin_memory() recurses into containers
        # Threads waiting on the condition: with none (every fork but a rare one), open()
        # and leave() skip notify_all, which is most of a fork's cost here.
        self.waiting = 0

    def _held_for(self, me: int) -> bool:
        # A forking thread's own calls pass: it never waits for itself.
        return any(ident != me for ident in self.closers)

    def enter(self) -> bool:
        """Wait while a fork is under way; True if this call is counted (the outermost one)."""
        depth = getattr(self.local, "depth", 0)
        if depth == 0:
            me = threading.get_ident()
            with self.lock:
                while self._held_for(me):
                    self._wait()
                self.inside += 1
        self.local.depth = depth + 1
        return depth == 0

    def leave(self, counted: bool) -> None:
        self.local.depth -= 1
        if not counted:
            return
        with self.lock:
            self.inside -= 1
            if self.inside == 0 and self.waiting:
                self.condition.notify_all()

    def close(self, timeout: float) -> bool:
        """Stop new calls and wait for those in progress; False if they outlast ``timeout``.
        Each close must be followed by one ``open()`` from the same thread."""
        me = threading.get_ident()
        with self.lock:
            self.closers[me] = self.closers.get(me, 0) + 1
            mine = getattr(self.local, "depth", 0) > 0  # never wait for ourselves
            if self.inside <= int(mine):
                return True  # nothing in progress: the usual case
            self.waiting += 1
            try:
                return self.condition.wait_for(lambda: self.inside <= int(mine), timeout)
            finally:
                self.waiting -= 1

    def open(self) -> None:
        """Undo this thread's last ``close()``; a no-op for a thread that did not close."""
        me = threading.get_ident()
        with self.lock:
            count = self.closers.get(me, 0)
            if count == 0:
                return
            if count == 1:
                del self.closers[me]
            else:
                self.closers[me] = count - 1
            if self.waiting:
                self.condition.notify_all()

    def _wait(self) -> None:
        """condition.wait(), counted in ``waiting`` (the condition's lock held)."""
        self.waiting += 1
        try:
            self.condition.wait()
        finally:
            self.waiting -= 1


def _gated_pin_memory(data: Any, device: Any = None) -> Any:
    gate = BACKEND.gate
    counted = gate.enter()
    try:
        return BACKEND.original(data, device)  # type: ignore[misc]
    finally:
        gate.leave(counted)


def gated() -> bool:
    """Whether torch's pin_memory() currently goes through the gate."""
    module = sys.modules.get(PIN_MEMORY_MODULE)
    return module is not None and getattr(module, "pin_memory", None) is _gated_pin_memory


def remove_gate() -> None:
    """Give torch back its own ``pin_memory()`` (``safeloader.uninstall()``); idempotent, and a wrapper
    installed over the gate since is left in place."""
    module: Any = sys.modules.get(PIN_MEMORY_MODULE)
    original = BACKEND.original
    if module is not None and original is not None and getattr(module, "pin_memory", None) is _gated_pin_memory:
        module.pin_memory = original


def status() -> str:
    """Whether the gate is in place, in words."""
    if gated():
        return "active: worker forks wait for pin-memory threads to leave pin_memory()"
    module = sys.modules.get(PIN_MEMORY_MODULE)
    if module is not None and not hasattr(module, "pin_memory"):
        return f"inactive: this torch has no {PIN_MEMORY_MODULE}.pin_memory to gate"
    return "inactive until the first safeloader-armed loader starts forked workers"


class PinMemoryBackend(Backend):
    name = NAME
    description = 'worker forks wait for pin-memory threads to leave pin_memory() (no lock inherited held)'
    # Its `before` runs last (only the watchdog's clock after it), right before the fork, and its
    # `after_in_parent` first, so pin threads wait as briefly as possible.
    first = True
    runs_after = (hook_names.WATCHDOG,)
    requires = ("torch",)

    def __init__(self) -> None:
        self._gate: _Gate | None = _Gate()  # None in a fresh worker until something uses it
        self._gate_lock = threading.Lock()  # makes the worker's gate; a fresh one in each worker
        self._parent_gate: _Gate | None = None  # in a worker: the inherited gate, kept (freeing it copies its pages)
        self.original: Callable[..., Any] | None = None
        """torch's own pin_memory(), once the gate replaced it."""

    @property
    def gate(self) -> _Gate:
        """This process's gate. A forked worker makes its own on first use (usually never:
        pin-memory threads run in the main process), instead of at every fork."""
        gate = self._gate
        if gate is None:
            with self._gate_lock:
                if self._gate is None:
                    self._gate = _Gate()
                gate = self._gate
        return gate

    def _install_gate(self) -> None:
        pin_module: Any = importlib.import_module(PIN_MEMORY_MODULE)
        current = getattr(pin_module, "pin_memory", None)
        if current is None or current is _gated_pin_memory:
            return  # a torch without this function: nothing to gate (status() says so)
        self.original = current
        pin_module.pin_memory = _gated_pin_memory

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        """Install the gate before the first armed loader starts its workers (and its pin thread)."""
        if start_method == "fork" and not gated():
            self._install_gate()

    def before(self, ctx: ForkContext | None) -> None:
        if not gated() or _context.held_for_start(NAME):
            return  # no gate, or closed since the start's first fork
        # At a start safeloader armed, closed until its last fork (then opened by disarm): its other
        # forks have nothing to do. Registered first: opening a gate this thread did not close is a no-op.
        if ctx is not None:
            ctx.hold_for_start(NAME, self.gate.open)
        if not self.gate.close(WAIT_SECONDS):
            warnings.warn(
                f"safeloader: a pin-memory thread stayed inside pin_memory() for more than {WAIT_SECONDS:g} s; "
                "forking the DataLoader worker anyway (it may hang if that thread holds a C library lock)",
                RuntimeWarning,
                stacklevel=2,
            )

    def after_in_parent(self, ctx: ForkContext, plan: None) -> None:
        # Only this thread's own close: its `before` may have found no gate to close.
        if not _context.held_for_start(NAME):
            self.gate.open()

    def fast_fork(self, ctx: ForkContext, plan: None) -> FastFork | None:
        if gated() and not _context.held_for_start(NAME):
            return None  # its before would close the gate at a later fork
        # Held closed for the whole start, or no gate: nothing to do at later forks while torch's
        # pin_memory() stays the function seen now.
        pin_module = sys.modules.get(PIN_MEMORY_MODULE)
        if pin_module is None or "pin_memory" not in vars(pin_module):
            return FastFork()
        return FastFork(watched=((vars(pin_module), "pin_memory", vars(pin_module)["pin_memory"]),))

    def after_in_child(self, ctx: ForkContext, plan: None) -> None:
        # The child has none of the parent's pin threads: it starts from an open gate,
        # made on first use. A fresh lock too: another thread may have held the parent's.
        self._gate_lock = threading.Lock()
        self._parent_gate, self._gate = self._gate, None

    def status(self) -> str:
        return status()

    def hazards(self) -> list[Hazard]:
        """Live pin-memory threads: the gate keeps a worker fork from inheriting a lock one holds."""
        from .._torch_internals import pin_memory_threads

        return [
            Hazard("python thread", "pin_memory", f"Python thread {thread.name} (a DataLoader's pin-memory thread)",
                   otherwise="start loaders one after the other", threads=(thread.ident or 0,))
            for thread in pin_memory_threads()
        ]


BACKEND = PinMemoryBackend()
