"""How the watchdog samples a running worker without disturbing it (issue 39, item 2).

- faulthandler's handler for a user signal leaves errno as its own writes set it (0): a library
  between a failed call and its check of errno then takes the failure for a success (pyzmq's recv
  returned an empty message) or fails an assertion (libzmq's "errno == EAGAIN", which aborted the
  worker). Wrapped by ``native.keep_errno``, it leaves errno alone.
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest

import safeloader

from .subproc import check_script

pytestmark = pytest.mark.timeout(120)

needs_native = pytest.mark.skipif(not safeloader.NATIVE, reason="needs the C extension")


@pytest.fixture(scope="module")
def errno_probe(tmp_path_factory) -> Path:
    library = tmp_path_factory.mktemp("native") / "liberrnoprobe.so"
    compiler = sysconfig.get_config_var("CC") or "cc"
    source = Path(__file__).parent / "native" / "errno_probe.c"
    subprocess.run([*compiler.split()[:1], "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True)
    return library


@needs_native
def test_faulthandlers_dump_leaves_errno_as_it_found_it_once_kept(errno_probe):
    # 200 signals into a loop that sets errno and reads it back. Bare, CPython's handler (chain=False)
    # leaves errno changed in about half the reads it interrupts: the probe sees it. Kept, in none.
    bare = check_script("errno_under_signals.py", errno_probe, "bare", timeout=60).stdout.split()
    kept = check_script("errno_under_signals.py", errno_probe, "kept", timeout=60).stdout.split()
    assert bare[:2] == ["exit", "0"] and bare[-1] == "True" and int(bare[3]) > 0, bare
    assert kept == ["exit", "0", "changed", "0", "dumps", "True"], kept
