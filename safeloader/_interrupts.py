"""Whether an exception interrupts (Ctrl-C, a signal handler's) rather than fails: it then reaches
the user as itself, never as a ``HookError``. Shared by the fork dispatch and the loader start."""

from __future__ import annotations

import signal
from typing import Any


def is_interrupt(exc: BaseException, *, in_worker: bool = False) -> bool:
    """Whether ``exc`` interrupts rather than fails (a BaseException that is not an Exception, or a signal
    handler's), reaching the user as itself (a worker's rules: docs/internals.md, ``safeloader._dispatch``)."""
    if isinstance(exc, KeyboardInterrupt):
        return not (in_worker and _raised_by_raise_statement(exc)) or _raised_by_signal_handler(exc)
    if not (in_worker or isinstance(exc, Exception)):
        return True
    return _raised_by_signal_handler(exc)


def _raised_by_raise_statement(exc: BaseException) -> bool:
    """Whether ``exc`` was first raised by a ``raise`` statement (where its traceback begins), not
    by a signal: SIGINT's default handler, written in C, raises KeyboardInterrupt where Python next
    checks for signals (a call's return, a loop's jump), never at a ``raise``."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    import opcode  # only here: an interrupt in a worker's hook is rare

    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] == opcode.opmap["RAISE_VARARGS"]


# The code of each Python signal handler when last looked up: module state, as handlers are the process's.
_handler_codes: frozenset[Any] = frozenset()


def _raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether a Python signal handler's frame is in ``exc``'s traceback. Fast while the
    handlers are those of the last look-up: an interrupt storm must find its way out quickly."""
    global _handler_codes
    if exc.__traceback__ is None:
        return False
    if _in_traceback(exc, _handler_codes):
        return True
    codes = set()
    for signum in range(1, signal.NSIG):  # not signal.valid_signals(): enum conversions, 100 times slower
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        if not callable(handler):
            continue  # SIG_DFL, SIG_IGN, or a handler installed outside Python
        function = getattr(handler, "__func__", handler)  # a bound method's function
        code = getattr(function, "__code__", None)
        if code is None:  # a callable object: its __call__
            call = type(handler).__dict__.get("__call__")  # (a class defining it)
            code = getattr(getattr(call, "__func__", call), "__code__", None)
        if code is not None:
            codes.add(code)
    _handler_codes = frozenset(codes)
    return _in_traceback(exc, _handler_codes)


def _in_traceback(exc: BaseException, codes: frozenset[Any]) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False
