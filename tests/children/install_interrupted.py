"""install() and uninstall() cut short at each of their lines in turn, then called again.

An exception is raised at the k-th line ``install()`` (or ``uninstall()``) runs, the functions
it calls included, for k = 1, 2, ... until the call completes: as Ctrl-C (or any signal
handler's exception) can land there. After each, the next call, not cut, must leave torch's
class and names all installed or all torch's own. An ``install()`` cut after it patched torch
but before it kept its record left torch patched for good: ``uninstall()`` did not see it.

Prints ``cut at <k> places; torn <t>`` and the first torn state: (where, installed(), torch's
method patched, torch.utils.data.DataLoader rebound, torch's __reduce_ex__ patched).
"""

import sys

import torch.utils.data
import torch.utils.data.dataloader

import safeloader

TORCH_CLASS = torch.utils.data.dataloader.DataLoader
TORCH_GET_ITERATOR = TORCH_CLASS.__dict__["_get_iterator"]
INSTALLED, TORCHS = (True, True, True, True), (False, False, False, False)


class Cut(Exception):
    pass


def cut_at(call, k: int) -> bool:
    """Run ``call``, raising ``Cut`` at the ``k``-th line it runs; whether it was cut."""
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
            if lines == k:
                sys.settrace(None)
                raise Cut()
        return tracer

    sys.settrace(tracer)
    try:
        call()
    except Cut:
        return True
    finally:
        sys.settrace(None)
    return False


def state() -> tuple[bool, bool, bool, bool]:
    return (
        safeloader.installed(),
        TORCH_CLASS.__dict__["_get_iterator"] is not TORCH_GET_ITERATOR,
        torch.utils.data.DataLoader is not TORCH_CLASS,
        "__reduce_ex__" in TORCH_CLASS.__dict__,
    )


places, torn = 0, []
for cut_call, then, expected in (
    (safeloader.install, (safeloader.uninstall,), TORCHS),
    (safeloader.uninstall, (safeloader.install, safeloader.uninstall), TORCHS),
    (safeloader.uninstall, (safeloader.install,), INSTALLED),
):
    for k in range(1, 10_000):
        if cut_call is safeloader.uninstall:
            safeloader.install()
        cut = cut_at(cut_call, k)
        for call in then:
            call()
            if call is safeloader.install and state() != INSTALLED:
                torn.append((f"install() after {cut_call.__name__}() cut at line {k}", *state()))
        if state() != expected:
            torn.append((f"{then[-1].__name__}() after {cut_call.__name__}() cut at line {k}", *state()))
        safeloader.uninstall()
        if not cut:
            break
        places += 1
print(f"cut at {places} places; torn {len(torn)}", torn[:1])
