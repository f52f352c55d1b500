"""torch's worker loop replaced by a wrapper of another name (as an upstream rename would look).

argv: the wrapper's name, ``torch`` or ``safeloader`` (whose DataLoader). Prints
``DATA <items>`` or ``RAISED <type> <error>``, then ``HOOKS RAN <n>``.
"""

import inspect
import sys

from torch.utils.data._utils import worker

import safeloader

NAME, LOADER = sys.argv[1:]

original = worker._worker_loop


def renamed(*args, **kwargs):
    return original(*args, **kwargs)


renamed.__name__ = renamed.__qualname__ = NAME
renamed.__module__ = original.__module__
renamed.__signature__ = inspect.signature(original)
worker._worker_loop = renamed  # what torch's iterator starts its workers with

ran = []
safeloader.register_at_fork(after_in_parent=lambda: ran.append(1), name="probe")
if LOADER == "torch":
    from torch.utils.data import DataLoader
else:
    from safeloader import DataLoader
try:
    print("DATA", [int(x) for b in DataLoader(list(range(6)), batch_size=2, num_workers=2) for x in b])
except Exception as error:
    print("RAISED", type(error).__name__, error)
print("HOOKS RAN", len(ran))
