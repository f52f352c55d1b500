"""Every ```python block of README.md runs as written, so the README cannot drift from the code.

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

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# What the README's fragments take as given. Keep it to names a reader would
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
    assert batches, "the README's loader yielded nothing"
print("README block ran", flush=True)
"""

# Blocks that are deliberately not run, by their first line, each with why.
# Prefer making a block runnable; an entry that matches no block fails.
NOT_RUNNABLE: dict[str, str] = {}


def readme_blocks() -> list[tuple[int, str]]:
    text = README.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in BLOCK.finditer(text)]


BLOCKS = readme_blocks()


def test_the_readme_has_python_blocks_and_every_exemption_matches_one():
    assert len(BLOCKS) >= 5
    first_lines = {code.splitlines()[0] for _, code in BLOCKS}
    assert set(NOT_RUNNABLE) <= first_lines, set(NOT_RUNNABLE) - first_lines


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs_as_written(line, code, tmp_path):
    first = code.splitlines()[0]
    if first in NOT_RUNNABLE:
        pytest.skip(f"README.md:{line} is not runnable: {NOT_RUNNABLE[first]}")
    result = run_python(PREAMBLE + code + EPILOGUE, timeout=90, cwd=str(tmp_path))
    assert not result.timed_out and result.returncode == 0, f"README.md:{line} failed:\n{code}\n{result}"
    assert "README block ran" in result.stdout
