"""Every ```python block of README.md and of docs/**/*.md runs as written, so the docs cannot drift from the code.

Blocks are found when the tests are collected: a block added later is tested
without changing this file. Each runs in a fresh interpreter under a deadline,
in a scratch directory, after PREAMBLE (which only completes fragments: names a
block uses without defining, such as ``dataset``, and the small files the
examples open). After the block, any ``loader`` it built is iterated once, so
an example whose loader cannot iterate fails here, as it would for a user.
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
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# What the fragments take as given. Keep it to names a reader would
# have in their own program; a block that needs more should define it itself.
PREAMBLE = """
import numpy as np
import torch
import h5py
from torch.utils.data import Dataset
import safeloader

class Squares(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, index):
        return torch.tensor([index, index * index])

dataset = ds = Squares()
with h5py.File("data.h5", "w") as f:
    f["images"] = np.arange(8 * 4 * 4, dtype=np.float32).reshape(8, 4, 4)
np.savez("x.npz", images=np.arange(8 * 4 * 4, dtype=np.float32).reshape(8, 4, 4))
"""

EPILOGUE = """
if isinstance(globals().get("loader"), torch.utils.data.DataLoader):
    batches = list(loader)
    assert batches, "the block's loader yielded nothing"
print("documented block ran", flush=True)
"""

# Blocks that are deliberately not run, by their first line, each with why.
# Prefer making a block runnable; an entry that matches no block fails.
NOT_RUNNABLE: dict[str, str] = {}


def markdown_files() -> list[Path]:
    """README.md, then every page under docs/ (sorted)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def python_blocks(path: Path) -> list[tuple[str, str]]:
    """Each ```python block of ``path`` as ("<file relative to the root>:<line>", code)."""
    text = path.read_text()
    name = path.relative_to(ROOT).as_posix()
    return [(f"{name}:{text.count(chr(10), 0, match.start()) + 1}", match.group(1)) for match in BLOCK.finditer(text)]


BLOCKS = [block for path in markdown_files() for block in python_blocks(path)]


def test_the_readme_and_docs_have_python_blocks_and_every_exemption_matches_one():
    readme = [where for where, _ in BLOCKS if where.startswith("README.md:")]
    assert len(readme) >= 3, readme
    assert len(BLOCKS) >= 5
    assert any(where.startswith("docs/") for where, _ in BLOCKS), "no ```python block found under docs/"
    first_lines = {code.splitlines()[0] for _, code in BLOCKS}
    assert set(NOT_RUNNABLE) <= first_lines, set(NOT_RUNNABLE) - first_lines


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_documented_block_runs_as_written(where, code, tmp_path):
    first = code.splitlines()[0]
    if first in NOT_RUNNABLE:
        pytest.skip(f"{where} is not runnable: {NOT_RUNNABLE[first]}")
    result = run_python(PREAMBLE + code + EPILOGUE, timeout=90, cwd=str(tmp_path))
    assert not result.timed_out and result.returncode == 0, f"{where} failed:\n{code}\n{result}"
    assert "documented block ran" in result.stdout
