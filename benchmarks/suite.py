"""The side-by-side suite: every scenario, every contender, alternating, hangs recorded.

Each (scenario, contender) gets its own child process, set up once (imports,
data opened, the parent's own first read) and then asked for one measurement
per round. Rounds visit the contenders in rotating order so that machine noise
hits all of them alike. A measurement that passes its deadline is a hang: the
child and its workers are killed, the hang is recorded, and that contender is
not run again in the scenario.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "@@result "
SETUP_DEADLINE = 180.0
MIN_DEADLINE = 60.0


@dataclass
class Child:
    scenario: str
    contender: str
    process: subprocess.Popen
    samples: list[dict] = field(default_factory=list)
    status: str = "ok"  # "ok", "hang", or "error: ..."

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def receive(self, deadline: float) -> dict | None:
        """The next result line, or None at the deadline."""
        stdout = self.process.stdout
        assert stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(stdout, selectors.EVENT_READ)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                line = stdout.readline()
                if not line:
                    return {"error": f"child exited with code {self.process.wait()}"}
                if line.startswith(MARKER):
                    return json.loads(line[len(MARKER):])
        finally:
            selector.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()


def start_child(scenario: str, contender: str, params_path: str) -> Child:
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.child", scenario, contender, params_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group: a hang is killed with its workers
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    return Child(scenario, contender, process)


def summarize(child: Child) -> dict:
    seconds = [s["seconds"] for s in child.samples if "seconds" in s]
    entry: dict = {"status": child.status, "samples": child.samples, "n": len(seconds)}
    if seconds:
        entry.update(
            median=statistics.median(seconds),
            min=min(seconds),
            max=max(seconds),
            correct=all(s.get("ok", False) for s in child.samples if "seconds" in s),
        )
        extra = [s["worker_uss_mb"] for s in child.samples if s.get("worker_uss_mb") is not None]
        if extra:
            entry["worker_uss_mb"] = statistics.median(extra)
    return entry


def run_scenario(name: str, contenders: list[str], params_path: str, repeats: int, progress) -> dict:
    children = [start_child(name, contender, params_path) for contender in contenders]
    try:
        ready_by = time.monotonic() + SETUP_DEADLINE
        for child in children:
            reply = child.receive(ready_by)
            if reply is None:
                child.status = "hang (setup)"
            elif "error" in reply:
                child.status = f"error: {reply['error']}"
        slowest = 0.0
        for round_ in range(repeats):
            shift = round_ % len(children)
            for child in children[shift:] + children[:shift]:
                if child.status != "ok":
                    continue
                progress(name, round_, repeats, child.contender)
                child.send("run")
                deadline = max(MIN_DEADLINE, 5 * slowest)
                result = child.receive(time.monotonic() + deadline)
                if result is None:
                    child.status = "hang"
                    child.samples.append({"hang_after_s": deadline})
                    child.kill()
                elif "error" in result:
                    child.status = f"error: {result['error']}"
                    child.samples.append(result)
                else:
                    child.samples.append(result)
                    slowest = max(slowest, result["seconds"])
    finally:
        for child in children:
            if child.process.poll() is None and child.status == "ok":
                try:
                    child.send("exit")
                    child.process.wait(timeout=30)
                except (BrokenPipeError, subprocess.TimeoutExpired):
                    pass
            child.kill()
    results = {child.contender: summarize(child) for child in children}
    base = results.get("safeloader", {}).get("median")
    for entry in results.values():
        if base and entry.get("median"):
            entry["ratio_to_safeloader"] = entry["median"] / base
    return results


def run_suite(scale: str, repeats: int, only: list[str] | None = None) -> dict:
    from . import common, scenarios

    table = scenarios.scenarios()
    names = [n for n in table if not only or any(o.lower() in n.lower() for o in only)]
    started = time.monotonic()

    def progress(scenario: str, round_: int, total: int, contender: str) -> None:
        index = names.index(scenario) + 1
        elapsed = time.monotonic() - started
        line = f"[{index}/{len(names)}] {scenario} | round {round_ + 1}/{total} | {contender} | {elapsed:.0f}s"
        print(f"\r{line:<110}", end="", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="safeloader-bench-") as directory:
        print("writing data...", file=sys.stderr, flush=True)
        params = scenarios.make_data(Path(directory), scale)
        params_path = os.path.join(directory, "params.json")
        Path(params_path).write_text(json.dumps(params))
        results = {name: run_scenario(name, list(table[name]), params_path, repeats, progress) for name in names}
    print(file=sys.stderr)
    return {
        "machine": common.machine(),
        "config": {"scale": scale, "repeats": repeats, "sizes": scenarios.sizes(scale)},
        "elapsed_s": time.monotonic() - started,
        "scenarios": results,
    }
