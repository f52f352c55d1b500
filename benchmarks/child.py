"""One contender in its own process: set up once, then measure on request.

Protocol on stdin/stdout: after setup it prints a result line ``{"ready": true}``
(or ``{"error": ...}`` if it cannot start); then each ``run`` line yields one
result line; ``exit`` ends it. Result lines start with a marker, so anything
else the program prints is ignored. :func:`serve` is this side of it, for any
program; :class:`benchmarks.suite.Child` the other side. ``python -m
benchmarks.child SCENARIO CONTENDER PARAMS`` serves one of the suite's contenders.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from .suite import MARKER


def reply(payload: dict) -> None:
    sys.stdout.write(MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _error(exc: Exception) -> dict:
    return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}


def serve(setup: Callable[[], Callable[[], dict]]) -> None:
    """Run ``setup()`` once, then reply with one call of the function it returns per ``run`` line."""
    try:
        measure = setup()
    except Exception as exc:  # a contender that cannot even start (e.g. cannot pickle)
        reply(_error(exc))
        return
    reply({"ready": True})
    for line in sys.stdin:
        if line.strip() == "exit":
            return
        try:
            reply(measure())
        except Exception as exc:
            reply(_error(exc))


def main(scenario: str, contender: str, params_path: str) -> None:
    from .scenarios import scenarios

    with open(params_path) as f:
        params = json.load(f)
    serve(lambda: scenarios()[scenario][contender](params))


if __name__ == "__main__":
    main(*sys.argv[1:4])
