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

from .common import summarize

MARKER = "@@result "
SETUP_DEADLINE = 180.0
MIN_DEADLINE = 60.0
# Figures some scenarios add to their results beside "seconds"; a contender's entry gets their median.
EXTRA_FIGURES = ("worker_uss_mb", "first_batch_s")


@dataclass
class Child:
    """A contender in its own process, speaking the protocol of :mod:`benchmarks.child`."""

    contender: str
    process: subprocess.Popen
    samples: list[dict] = field(default_factory=list)
    status: str = "ok"  # "ok", "hang", "hang (setup)" or "error: ..."

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

    def ready(self, deadline: float) -> bool:
        """Wait for the end of its set-up; a child that fails or passes the deadline gets that status."""
        reply = self.receive(deadline)
        if reply is None:
            self.status = "hang (setup)"
            self.kill()
        elif "error" in reply:
            self.status = f"error: {reply['error']}"
        return self.status == "ok"

    def measure(self, timeout: float) -> dict | None:
        """One measurement: its result (``{"error": ...}`` sets the status), or None past the
        timeout, when the child and its workers are killed as a hang."""
        self.send("run")
        result = self.receive(time.monotonic() + timeout)
        if result is None:
            self.status = "hang"
            self.kill()
        elif "error" in result:
            self.status = f"error: {result['error']}"
        return result

    def close(self) -> None:
        """Ask a healthy child to exit, then make sure it and its workers are gone."""
        if self.process.poll() is None and self.status == "ok":
            try:
                self.send("exit")
                self.process.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()


def start_child(contender: str, module: str, *args: str, quiet: bool = True) -> Child:
    """``python -m <module> <args>``, a program that serves one contender with :func:`benchmarks.child.serve`.
    Its stderr is dropped when ``quiet``."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if quiet else None,
        text=True,
        start_new_session=True,  # its own process group: a hang is killed with its workers
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    return Child(contender, process)


def summarize_child(child: Child) -> dict:
    """A contender's entry in the suite's JSON: its status and samples, the statistics of
    their seconds (:func:`benchmarks.common.summarize`), whether every result was correct,
    and the median of each of the ``EXTRA_FIGURES`` its results report."""
    timed = [s for s in child.samples if "seconds" in s]
    entry: dict = {"status": child.status, "samples": child.samples}
    entry.update(summarize([s.get("seconds") for s in child.samples]))
    if timed:
        entry["correct"] = all(s.get("ok", False) for s in timed)
        for figure in EXTRA_FIGURES:
            extra = [s[figure] for s in timed if s.get(figure) is not None]
            if extra:
                entry[figure] = statistics.median(extra)
    return entry


def run_scenario(name: str, contenders: list[str], params_path: str, repeats: int, progress) -> dict:
    children = [start_child(contender, "benchmarks.child", name, contender, params_path) for contender in contenders]
    try:
        ready_by = time.monotonic() + SETUP_DEADLINE
        for child in children:
            child.ready(ready_by)
        slowest = 0.0
        for round_ in range(repeats):
            shift = round_ % len(children)
            for child in children[shift:] + children[:shift]:
                if child.status != "ok":
                    continue
                progress(name, round_, repeats, child.contender)
                deadline = max(MIN_DEADLINE, 5 * slowest)
                result = child.measure(deadline)
                child.samples.append({"hang_after_s": deadline} if result is None else result)
                if child.status == "ok":
                    slowest = max(slowest, result["seconds"])
    finally:
        for child in children:
            child.close()
    results = {child.contender: summarize_child(child) for child in children}
    base = results.get("safeloader", {}).get("median")
    first_base = results.get("safeloader", {}).get("first_batch_s")
    for entry in results.values():
        if base and entry.get("median"):
            entry["ratio_to_safeloader"] = entry["median"] / base
        if first_base and entry.get("first_batch_s"):
            entry["first_batch_ratio_to_safeloader"] = entry["first_batch_s"] / first_base
    return results


def run_suite(scale: str, repeats: int, only: list[str] | None = None, skip: list[str] | None = None) -> dict:
    from . import common, data, scenarios

    table = scenarios.scenarios()
    names = [n for n in table if not only or any(o.lower() in n.lower() for o in only)]
    for name in names:  # "safeloader" is every scenario's ratio base: never skipped
        table[name] = {
            contender: setup
            for contender, setup in table[name].items()
            if contender == "safeloader" or not any(s.lower() in contender.lower() for s in skip or ())
        }
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
        "config": {"scale": scale, "repeats": repeats, "sizes": data.sizes(scale)},
        "elapsed_s": time.monotonic() - started,
        "scenarios": results,
    }
