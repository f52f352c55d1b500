"""The threadpools backend finds the pools threadpoolctl's whole scan finds, a library loaded through a link too.

A copy of torch's libgomp is loaded through a link whose own name has no BLAS/OpenMP prefix (as a
system ``libblas.so.3`` links to OpenBLAS). Prints, as JSON, the real paths the backend found, those
threadpoolctl's ``ThreadpoolController()`` found, and the copy's real path. With the argument
"public": as with a threadpoolctl whose private per-path step is gone (its public scan is asked).
"""

import ctypes
import json
import os
import shutil
import sys
import tempfile

import numpy  # noqa: F401  (its OpenBLAS)
import threadpoolctl
import torch

from safeloader import forkstate
from safeloader.backends import _blas_pools

if sys.argv[1:] == ["public"]:
    del threadpoolctl.ThreadpoolController._from_controllers

directory = tempfile.mkdtemp()
copy = os.path.join(directory, "libgomp-copy.so.1")
shutil.copy(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1"), copy)
link = os.path.join(directory, "libruntime.so")
os.symlink(copy, link)
ctypes.CDLL(link)
try:
    found = sorted(pool.path for pool in _blas_pools.PoolFinder().pools(forkstate._dynamic_linker().loaded()))
    whole = sorted(os.path.realpath(lib.filepath) for lib in threadpoolctl.ThreadpoolController().lib_controllers)
    print(json.dumps({"found": found, "whole": whole, "copy": os.path.realpath(copy)}))
finally:
    shutil.rmtree(directory)
sys.stdout.flush()
