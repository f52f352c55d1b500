"""A thread is still importing a module when a loader forks its 2 workers, longer than
safeloader waits for it (IMPORT_WAIT_SECONDS, lowered here); the Dataset does not import it.

argv: a directory for the module. Prints the items, then the warnings, one per line.
"""

import sys
import threading
import time
import warnings
from pathlib import Path

import torch

import safeloader
from safeloader import _registry

directory = Path(sys.argv[1])
(directory / "very_slow_to_import.py").write_text("import time\ntime.sleep(4)\n")
sys.path.insert(0, str(directory))
_registry.IMPORT_WAIT_SECONDS = 0.3


class Plain(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


importer = threading.Thread(target=lambda: __import__("very_slow_to_import"))
importer.start()
time.sleep(0.3)  # the thread is inside the import now
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(sorted(safeloader.DataLoader(Plain(), batch_size=None, num_workers=2)), flush=True)
for warning in caught:
    print(f"{warning.category.__name__}: {warning.message}")
importer.join()
