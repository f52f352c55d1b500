"""A forked child runs nested Python functions for ever (each turn makes objects, calls a method
through C and a lambda); its parent reads the child's Python frames from outside
(``native.python_frames``) 300 times while it runs. Prints, as JSON: how many reads found frames,
how many found the child's chain (top < middle < leaf, innermost last), every function name and
file seen inside top(), and whether the parent's own frames read the same way name this script's
functions.
"""

import json
import os
import sys
import time

from safeloader import native


class Thing:
    def __init__(self, x: int) -> None:
        self.x = x + 1


def leaf(n: int) -> int:
    total = 0
    for i in range(n):
        total += Thing(i).x
    return total


def middle() -> None:
    while True:
        leaf(100)
        sorted([3, 1, 2], key=lambda v: -v)  # a lambda called from C


def top() -> None:
    middle()


def own_frames() -> list[str]:
    return [name for _, name in native.python_frames(os.getpid(), native.thread_state()) or []]


ready = os.pipe()
child = os.fork()
if child == 0:
    os.write(ready[1], b"%d\n" % native.thread_state())
    top()
    os._exit(0)
state = int(os.read(ready[0], 64))
time.sleep(0.2)
reads = found = chained = 0
names: set[str] = set()
files: set[str] = set()
for _ in range(300):
    frames = native.python_frames(child, state)
    reads += 1
    if not frames:
        continue
    found += 1
    called = [name for _, name in frames]
    mine = frames[: called.index("top") + 1] if "top" in called else frames
    names.update(name for _, name in mine)  # up to top(): what runs it (the test runner) left out
    files.update(file for file, _ in mine)
    outer = [name for _, name in frames if name in ("top", "middle", "leaf")]
    chained += outer in (["leaf", "middle", "top"], ["middle", "top"])
os.kill(child, 9)
os.waitpid(child, 0)
print(json.dumps({
    "reads": reads, "found": found, "chained": chained, "names": sorted(names),
    "files": sorted(files), "same_state": state == native.thread_state(),
    "own": own_frames()[:2], "script": os.path.abspath(__file__), "version": sys.version_info[:2],
}))
