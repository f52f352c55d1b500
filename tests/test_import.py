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


def test_every_subpackage_is_packaged():
    # A subpackage missing from pyproject's list installs nowhere but in an editable checkout.
    from pathlib import Path

    import tomllib

    root = Path(__file__).parent.parent
    packaged = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(root).parts) for init in (root / "safeloader").rglob("__init__.py")
    }
    assert packaged == found


def test_every_public_name_resolves():
    import safeloader

    missing = []
    for name in safeloader.__all__:
        try:
            getattr(safeloader, name)
        except AttributeError as error:
            missing.append(f"{name}: {error}")
    assert missing == []
