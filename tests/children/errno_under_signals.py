"""A forked child loops setting errno and reading it back (tests/native/errno_probe.c, argv[1]),
in C called with the GIL held as Cython code is, while its parent sends it ``faulthandler``'s signal
(registered as the watchdog registers it in a worker: all threads, chain=False) 200 times.

argv[2]: ``kept`` (the handler wrapped by ``native.keep_errno``, as the watchdog does) or ``bare``.
Prints how many of the child's reads found errno changed, and whether dumps were written.
"""

import ctypes
import faulthandler
import mmap
import os
import sys
import time

from safeloader import native

library, how = sys.argv[1:]
probe = ctypes.PyDLL(library)  # the GIL held, as Cython code holds it
probe.errno_changes.restype = ctypes.c_long
probe.errno_changes.argtypes = [ctypes.c_long]
signum = native.free_signals(1)[0]
dump = os.memfd_create("python-stacks")
faulthandler.register(signum, file=dump, all_threads=True, chain=False)
if how == "kept":
    assert native.keep_errno(signum) and native.keep_errno(signum)  # wrapped once, the second call finds it so
stop = mmap.mmap(-1, 1)
results = os.pipe()
child = os.fork()
if child == 0:
    changed = 0
    while not stop[0]:  # nearly all its time in the C loop, where the signals land
        changed += probe.errno_changes(1_000_000)
    os.write(results[1], b"%d" % changed)
    os._exit(0)
time.sleep(0.2)
for _ in range(200):
    os.kill(child, signum)
    time.sleep(0.005)
stop[0] = 1
_, status = os.waitpid(child, 0)
changed = os.read(results[0], 64).decode()
print(f"exit {os.waitstatus_to_exitcode(status)} changed {changed} dumps {os.fstat(dump).st_size > 0}")
