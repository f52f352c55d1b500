"""Builds the optional C extension ``safeloader._native`` from ``csrc/``.

If it cannot be compiled, the package installs with its pure-Python fallback,
unless SAFELOADER_REQUIRE_NATIVE=1 (set by the test command), which makes the
build fail loudly instead.
"""

import os
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REQUIRED = os.environ.get("SAFELOADER_REQUIRE_NATIVE") == "1"


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:
            if REQUIRED:
                raise
            warnings.warn(f"safeloader: C extension not built ({exc}); using the pure-Python fallback", stacklevel=1)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            if REQUIRED:
                raise
            warnings.warn(f"safeloader: C extension not built ({exc}); using the pure-Python fallback", stacklevel=1)


setup(
    ext_modules=[Extension("safeloader._native", ["csrc/_native.c", "csrc/backtrace.c"], extra_compile_args=["-O2", "-Wall"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
