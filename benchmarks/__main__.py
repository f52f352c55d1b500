"""Run the whole benchmark suite, side by side: ``python -m benchmarks [--quick]``.

Writes ``benchmarks/results/suite.json`` and ``suite.png`` and prints a
Markdown table; ``--table`` only prints the table of the saved JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import RESULTS, write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller data and 3 rounds: minutes on 2 cores")
    size.add_argument("--tiny", action="store_true", help="toy data, to check the harness itself")
    parser.add_argument("--repeats", type=int, help="rounds per contender (default 3 quick, 7 full)")
    parser.add_argument("--only", nargs="*", help="run only scenarios whose name contains one of these")
    parser.add_argument("--skip", nargs="*", help="leave out contenders whose name contains one of these")
    parser.add_argument("--output", default=str(RESULTS / "suite.json"), help="where to write the JSON")
    parser.add_argument("--table", action="store_true", help="print the Markdown table of --output and exit")
    args = parser.parse_args(argv)

    from . import report

    if args.table:
        with open(args.output) as f:
            print(report.markdown(json.load(f)))
        return 0
    from .suite import run_suite

    scale = "tiny" if args.tiny else "quick" if args.quick else "full"
    repeats = args.repeats or (7 if scale == "full" else 3)
    result = run_suite(scale, repeats, args.only, args.skip)
    write_json(Path(args.output), result)
    png = report.chart(result, Path(args.output).with_suffix(".png"))
    print(report.markdown(result))
    print(f"\nwrote {args.output} and {png} in {result['elapsed_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
