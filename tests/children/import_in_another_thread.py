"""A thread is importing a (slow) module when the main thread's loader forks its worker,
and the worker imports the same module.

argv: ``torch`` or ``safeloader`` (whose DataLoader), and a directory for the module.
Prints the items, or hangs (the worker waits for the import lock of a thread it does not have).
"""

import sys
import threading
from pathlib import Path

import torch

import safeloader

which, directory = sys.argv[1], Path(sys.argv[2])
# The module says when its import has begun (an event of this script's), then takes 1.5 s.
(directory / "slow_to_import.py").write_text(
    "import sys, time\nsys.modules['__main__'].importing.set()\ntime.sleep(1.5)\nVALUE = 7\n"
)
sys.path.insert(0, str(directory))


class ImportsInTheWorker(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        import slow_to_import

        return slow_to_import.VALUE + index


importing = threading.Event()
importer = threading.Thread(target=lambda: __import__("slow_to_import"))
importer.start()
assert importing.wait(30)  # the thread is inside the import now
loader_class = torch.utils.data.DataLoader if which == "torch" else safeloader.DataLoader
print(list(loader_class(ImportsInTheWorker(), batch_size=None, num_workers=1)), flush=True)
importer.join()
