"""Command line: ``python -m safeloader demo`` or ``python -m safeloader doctor [--json] [--import pkg ...]``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m safeloader`` and the ``safeloader`` console script."""
    parser = argparse.ArgumentParser(prog="safeloader", description="Fork-safe DataLoader workers for PyTorch.")
    commands = parser.add_subparsers(dest="command", required=True)
    from . import demo as demo_module  # numpy and argparse: torch, imported with safeloader, has them loaded

    demo = commands.add_parser(
        "demo",
        help="torch's DataLoader and safeloader's side by side on zarr (zarrs), HDF5 and npz data",
        description=demo_module.DESCRIPTION,
    )
    demo_module.add_arguments(demo)
    doctor = commands.add_parser(
        "doctor",
        help="what is live at fork here, which hook handles each, and what will break in workers",
        description="List what is live in this process that a forked DataLoader worker would inherit (native "
        "thread pools, open files, CUDA, other threads), which safeloader hook handles each, and what would "
        "break in a worker, each with its fix. Use --import to import your program's libraries first.",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON instead of text")
    doctor.add_argument(
        "--import", dest="imports", nargs="+", default=[], metavar="PKG", help="import these modules first"
    )
    args = parser.parse_args(argv)

    if args.command == "demo":
        return demo_module.run(args)
    from ._doctor import doctor as run_doctor

    try:
        run_doctor(imports=args.imports, json=args.json)
    except ImportError as error:
        print(f"safeloader doctor: --import must name importable modules, got {error.name!r}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
