"""safeloader._native imported a second time (its exec slot runs again): one fork is still counted
once by each module object. Prints both counts, from the child."""

import importlib
import os
import sys

from safeloader import _native as first

del sys.modules["safeloader._native"]
second = importlib.import_module("safeloader._native")
assert second is not first
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, f"{first.fork_generation()} {second.fork_generation()}".encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 100).decode())
