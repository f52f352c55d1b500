"""A thread id reused by a thread of another library: ``thread_owners.owners`` names the new thread's
library, not the one the id's dead thread was found in.

Run in a user and PID namespace of its own (``unshare -Urpf --mount-proc``), where this process may
choose the next id the kernel hands out (``/proc/sys/kernel/ns_last_pid``): numpy's OpenBLAS starts a
thread, which is attributed; a fork ends it (OpenBLAS's own fork handler stops its threads); its id
then goes to a thread of tiny_pool (argv[1], a library built by the test). Both threads keep the
kernel name they inherited from the main thread, as most native pools' threads do.

Prints JSON: the id, its owner before and after, the kernel names then.
"""

import ctypes
import json
import os
import sys
import time

import numpy as np

from safeloader import native
from safeloader.diagnostics import thread_owners


def owned(word: str) -> tuple[dict[int, str], dict[int, str | None]]:
    """The foreign threads' names and owners, once one is owned by a library named with ``word``."""
    deadline = time.monotonic() + 20
    while True:
        threads = native.thread_census().foreign
        owners = thread_owners.owners(threads)
        if any(word in (library or "") for library in owners.values()) or time.monotonic() > deadline:
            return dict(threads), owners
        time.sleep(0.05)


np.ones((500, 500)) @ np.ones((500, 500))  # OpenBLAS's threads start
names_before, before = owned("openblas")
tid = next(tid for tid, library in before.items() if "openblas" in (library or ""))
child = os.fork()  # OpenBLAS's fork handler ends its threads, in this process too
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
while os.path.exists(f"/proc/self/task/{tid}"):
    time.sleep(0.01)
with open("/proc/sys/kernel/ns_last_pid", "w") as last:
    last.write(str(tid - 1))  # the next thread made gets the ended thread's id
pool = ctypes.CDLL(sys.argv[1])
assert pool.pool_start(1) == 1
names_after, after = owned("tinypool")
print(json.dumps({"tid": tid, "before": before[tid], "after": after.get(tid),
                  "names": [names_before[tid], names_after.get(tid)]}))
