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


def _optional(step):
    """Run a build step; without SAFELOADER_REQUIRE_NATIVE=1 a failure only warns."""
    try:
        step()
    except Exception as exc:
        if REQUIRED:
            raise
        warnings.warn(f"safeloader: C extension not built ({exc}); using the pure-Python fallback", stacklevel=1)


class OptionalBuildExt(build_ext):
    # run() fails early when no compiler exists; build_extension() when one source does not compile.
    def run(self):
        _optional(super().run)

    def build_extension(self, ext):
        _optional(lambda: super(OptionalBuildExt, self).build_extension(ext))


setup(
    ext_modules=[
        Extension(
            "safeloader._native",
            [
                "csrc/_native.c",  # the module: method table and initialisation; the files of each job:
                "csrc/fork_generation.c",
                "csrc/threads.c",
                "csrc/proc_entries.c",
                "csrc/descriptors.c",
                "csrc/private_files.c",
                "csrc/file_locks.c",
                "csrc/signals.c",
                "csrc/backtrace.c",
                "csrc/python_frames.c",
                "csrc/loaded_objects.c",
                "csrc/code_map.c",
                "csrc/parked_threads.c",
                "csrc/exit_lock.c",
                "csrc/fast_fork.c",
            ],
            # The headers: also what puts them in the sdist.
            depends=["csrc/native.h", "csrc/backtrace.h", "csrc/exit_lock.h", "csrc/fast_fork.h"],
            # A header missing from an sdist must fail the build, not compile against a namesake elsewhere.
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
