"""Every ```python block of README.md and of docs/**/*.md runs as written, so the docs cannot drift from the code.

Blocks are found when the tests are collected, indented ones (inside a list item)
included: a block added later is tested without changing this file. Each runs in
a fresh interpreter under a deadline, in a scratch directory, with nothing
defined for it: a block that uses a name it does not define fails here, as it
would for a reader who pastes it. A block that is a fragment of the reader's own
program says so on its first line, naming in backticks what it takes as given,
e.g. ``# Fragment: `dataset` is your Dataset.``; the test then defines each named
thing first, from FIXTURES. After the block, any ``loader`` it built is iterated
once, so an example whose loader cannot iterate fails here, as it would for a user.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .subproc import run_python

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# A fence at any indentation; its closing fence at the same one.
BLOCK = re.compile(r"^(?P<indent>[ \t]*)```python\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL)
FRAGMENT = re.compile(r"^# Fragment: (?P<given>.*)$")

_SMALL_DATASET = """
import torch
from torch.utils.data import Dataset

class Squares(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, index):
        return torch.tensor([index, index * index])
"""

# What a fragment may take as given, by the name it gives in backticks: the reader's own things.
FIXTURES: dict[str, str] = {
    "dataset": _SMALL_DATASET + "dataset = Squares()\n",
    "ds": _SMALL_DATASET + "ds = Squares()\n",
    "data.h5": """
import h5py, numpy
with h5py.File("data.h5", "w") as f:
    f["images"] = numpy.arange(8 * 4 * 4, dtype=numpy.float32).reshape(8, 4, 4)
""",
    "mylib": """
import sys, types
mylib = sys.modules["mylib"] = types.ModuleType("mylib")  # imported: a backend requiring it runs
mylib.open_handles = lambda: []
mylib.reopen = lambda handles: None
""",
}

EPILOGUE = """
import torch as _torch
if isinstance(globals().get("loader"), _torch.utils.data.DataLoader):
    _batches = list(loader)
    assert _batches, "the block's loader yielded nothing"
print("documented block ran", flush=True)
"""

# Blocks that are deliberately not run, by their first line, each with why.
# Prefer making a block runnable; an entry that matches no block fails.
NOT_RUNNABLE: dict[str, str] = {}


def given(code: str) -> list[str]:
    """The fixtures a block names on its first line (``# Fragment: `a` ... `b` ...``); [] for a whole program."""
    match = FRAGMENT.match(code.splitlines()[0]) if code.strip() else None
    return re.findall(r"`([^`]+)`", match.group("given")) if match else []


def markdown_files() -> list[Path]:
    """README.md, then every page under docs/ (sorted)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def python_blocks(path: Path) -> list[tuple[str, str]]:
    """Each ```python block of ``path`` as ("<file relative to the root>:<line>", code)."""
    return blocks_in(path.read_text(), path.relative_to(ROOT).as_posix())


def blocks_in(text: str, name: str) -> list[tuple[str, str]]:
    """Each ```python block of the markdown ``text``, its indentation removed, as ("<name>:<line>", code)."""
    found = []
    for match in BLOCK.finditer(text):
        indent = match.group("indent")
        lines = match.group("code").splitlines(keepends=True)
        code = "".join(line[len(indent) :] if line.startswith(indent) else line.lstrip(" \t") for line in lines)
        found.append((f"{name}:{text.count(chr(10), 0, match.start()) + 1}", code))
    return found


BLOCKS = [block for path in markdown_files() for block in python_blocks(path)]


def test_the_readme_and_docs_have_python_blocks_and_every_exemption_matches_one():
    readme = [where for where, _ in BLOCKS if where.startswith("README.md:")]
    assert len(readme) >= 3, readme
    assert len(BLOCKS) >= 5
    assert any(where.startswith("docs/") for where, _ in BLOCKS), "no ```python block found under docs/"
    first_lines = {code.splitlines()[0] for _, code in BLOCKS}
    assert set(NOT_RUNNABLE) <= first_lines, set(NOT_RUNNABLE) - first_lines


def test_a_block_indented_in_a_list_item_is_found_and_dedented():
    text = "- A list item:\n\n  ```python\n  def f():\n      return 1\n\n  f()\n  ```\n\n```python\nprint(2)\n```\n"
    assert blocks_in(text, "x.md") == [("x.md:3", "def f():\n    return 1\n\nf()\n"), ("x.md:10", "print(2)\n")]
    usage = dict(python_blocks(DOCS / "usage.md"))
    assert any(code.startswith("# Fragment: `mylib`") and "class MyLibBackend" in code for code in usage.values())


def test_every_fragment_names_what_it_takes_from_a_known_fixture():
    assert given("# Fragment: `dataset` is your Dataset.\nprint(dataset)\n") == ["dataset"]
    assert given("import safeloader\n") == []
    for where, code in BLOCKS:
        if FRAGMENT.match(code.splitlines()[0]):
            assert given(code), f"{where}: a fragment names what it takes as given, in backticks"
            assert set(given(code)) <= set(FIXTURES), f"{where}: no fixture for {set(given(code)) - set(FIXTURES)}"


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_documented_block_runs_as_written(where, code, tmp_path):
    first = code.splitlines()[0]
    if first in NOT_RUNNABLE:
        pytest.skip(f"{where} is not runnable: {NOT_RUNNABLE[first]}")
    preamble = "".join(FIXTURES[name] for name in given(code) if name in FIXTURES)
    result = run_python(preamble + code + EPILOGUE, timeout=90, cwd=str(tmp_path))
    assert not result.timed_out and result.returncode == 0, f"{where} failed:\n{code}\n{result}"
    assert "documented block ran" in result.stdout
