"""Seconds from a loader's creation to the named error, for each hang case of issue 39 (goal <= 10 s).

    python -m benchmarks.bench_time_to_error [--rounds 5] [--cases duckdb-warn,zmq]

torch's loader hangs on every case below (tests/test_library_pools_under_fork.py,
tests/test_openmp_release.py, tests/test_unknown_pools.py show it): there is no torch figure
to divide by, only safeloader's time to name the hang (or to refuse, or to finish where it fixes it).
Each run is a fresh interpreter running a test child; the cases alternate, round by round, and
the machine's load is printed with each round. Cases:

- ``duckdb-default``: DuckDB's pool used in the parent, default arguments: refused at the start.
- ``duckdb-warn``: the same with ``on_unsafe_fork='warn'``: the workers fork, wait in DuckDB's
  pool; the watchdog names them.
- ``gomp-default``: LightGBM's predict (its own OpenMP thread count on every call) after the parent
  ran its regions: fixed (the parent's pool released before each fork), the loader's end.
- ``gomp-unreleased``: the same with the threadpools backend disabled and ``on_unsafe_fork='warn'``:
  the workers wait in libgomp; the watchdog names them.
- ``zmq``: a pyzmq socket made in ``__init__``, ``on_unsafe_fork='warn'``: the workers spin.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILDREN = Path(__file__).resolve().parent.parent / "tests" / "children"
CASES = {
    "duckdb-default": ({}, ["library_under_fork.py", "duckdb", "safeloader", "{scratch}"]),
    "duckdb-warn": ({"on_unsafe_fork": "warn"}, ["library_under_fork.py", "duckdb", "safeloader", "{scratch}"]),
    "gomp-default": ({}, ["openmp_own_count.py", "safeloader", "torch-first", "-"]),
    "gomp-unreleased": (
        {"on_unsafe_fork": "warn", "disable_hooks": ["threadpools"]},
        ["openmp_own_count.py", "safeloader", "torch-first", "-"],
    ),
    "zmq": ({}, ["spinning_worker.py", "safeloader", "zmq"]),
}
TIMED = re.compile(r"^TIMED (\S+) after ([0-9.]+) s$", re.M)


def child(options: dict, argv: list[str]) -> None:
    """In the child: safeloader configured with ``options``, its DataLoader timed from creation to its
    first error (or its end), then the test child ``argv`` run as ``__main__``."""
    import runpy

    import safeloader

    if options:
        safeloader.configure(**options)
    base = safeloader.DataLoader
    reported: list[bool] = []

    def report(started: float, error: BaseException | None) -> None:
        if not reported:  # the first outcome only: a refusal, the named stall, or the end
            reported.append(True)
            outcome = type(error).__name__ if error is not None else "done"
            print(f"TIMED {outcome} after {time.monotonic() - started:.2f} s", file=sys.stderr, flush=True)

    class Timed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            self._created = time.monotonic()
            super().__init__(*args, **kwargs)

        def __iter__(self):  # type: ignore[no-untyped-def]
            try:
                iterator = super().__iter__()
            except Exception as error:
                report(self._created, error)
                raise

            def items():  # type: ignore[no-untyped-def]
                try:
                    yield from iterator
                except Exception as error:
                    report(self._created, error)
                    raise
                report(self._created, None)

            return items()

    safeloader.DataLoader = Timed  # type: ignore[misc]
    sys.argv = [str(CHILDREN / argv[0]), *argv[1:]]
    sys.path[0] = str(CHILDREN)
    runpy.run_path(sys.argv[0], run_name="__main__")


def run(case: str, scratch: str) -> tuple[str, float] | str:
    """(outcome, seconds), or what went wrong instead."""
    options, argv = CASES[case]
    command = [sys.executable, "-m", "benchmarks.bench_time_to_error", "--child", json.dumps(options),
               *(arg.format(scratch=scratch) for arg in argv)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, start_new_session=True)
    except subprocess.TimeoutExpired:
        return "no outcome: timed out after 180 s"
    found = TIMED.search(done.stderr)
    if found is None:
        return f"no outcome: exit {done.returncode}, stderr ends {done.stderr[-600:]!r}, stdout {done.stdout[-300:]!r}"
    return found.group(1), float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child[0]), args.child[1:])
        return
    cases = args.cases.split(",")
    seconds: dict[str, list[float]] = {case: [] for case in cases}
    outcomes: dict[str, set[str]] = {case: set() for case in cases}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}, load {' '.join(open('/proc/loadavg').read().split()[:3])}", flush=True)
            for case in cases:
                found = run(case, scratch)
                print(f"  {case}: {found if isinstance(found, str) else f'{found[0]} after {found[1]} s'}", flush=True)
                if not isinstance(found, str):
                    outcomes[case].add(found[0])
                    seconds[case].append(found[1])
    print(f"{'case':18} {'outcome':18} min / median / max (s), runs")
    for case in cases:
        values = seconds[case]
        if values:
            figures = f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"
            print(f"{case:18} {','.join(sorted(outcomes[case])):18} {figures}, {len(values)}")


if __name__ == "__main__":
    main()
