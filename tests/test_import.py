"""Importing safeloader is cheap: no torch until the loader is used, never a backend library."""

from __future__ import annotations

import pytest

from .subproc import check_python

# What `import safeloader` imports is a fresh interpreter's question (the suite's warm one has torch).
pytestmark = [pytest.mark.timeout(60), pytest.mark.fresh_interpreter]

BACKEND_LIBRARIES = ("zarr", "zarrs", "h5py", "threadpoolctl")


def test_import_loads_no_backend_library_and_not_torch():
    result = check_python(
        f"""
import sys, safeloader
hooks = [h.name for h in safeloader.hooks()]
loaded = [m for m in {(*BACKEND_LIBRARIES, "torch", "numpy")!r} if m in sys.modules]
print(loaded)
""",
        timeout=30,
    )
    assert result.stdout.strip() == "[]"


def test_loader_import_loads_torch_but_no_backend_library():
    result = check_python(
        f"""
import sys
from safeloader import DataLoader
import safeloader
safeloader.install(); safeloader.uninstall()
print([m for m in {BACKEND_LIBRARIES!r} if m in sys.modules], "torch" in sys.modules)
""",
        timeout=60,
    )
    assert result.stdout.strip() == "[] True"
