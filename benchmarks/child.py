"""One contender of one scenario, in its own process: set up once, then measure on request.

Protocol on stdin/stdout: after setup it prints a result line ``{"ready": true}``;
then each ``run`` line yields one result line; ``exit`` ends it. Result lines
start with a marker, so anything else the program prints is ignored.
"""

from __future__ import annotations

import json
import sys

from .suite import MARKER


def reply(payload: dict) -> None:
    sys.stdout.write(MARKER + json.dumps(payload) + "\n")
    sys.stdout.flush()


def main(scenario: str, contender: str, params_path: str) -> None:
    from .scenarios import scenarios

    with open(params_path) as f:
        params = json.load(f)
    try:
        measure = scenarios()[scenario][contender](params)
    except Exception as exc:  # a contender that cannot even start (e.g. cannot pickle)
        reply({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return
    reply({"ready": True})
    for line in sys.stdin:
        command = line.strip()
        if command == "exit":
            return
        try:
            reply(measure())
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"})


if __name__ == "__main__":
    main(*sys.argv[1:4])
