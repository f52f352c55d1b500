"""The names of safeloader's own fork hooks: what ``disable_hooks=`` and ``safeloader.disable`` take.

Each backend's module names its own hook (``NAME``); these constants are kept for code that imports
them and for modules below the backends, which cannot import one. A new backend needs none here.
"""

WATCHDOG = "watchdog"
FORKSTATE = "forkstate"
ZARRS = "zarrs"
POLARS = "polars"
SOCKETS = "sockets"
FILES = "files"
H5PY = "h5py"
LMDB = "lmdb"
FSSPEC = "fsspec"
THREADPOOLS = "threadpools"
TORCH = "torch"
GC = "gc"
PIN_MEMORY = "pin_memory"
EXECUTORS = "executors"
NPZ = "npz"
BLOSC2 = "blosc2"
PYAV = "pyav"
