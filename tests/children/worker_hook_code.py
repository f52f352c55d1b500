"""Which safeloader backends run code in a forked worker, by what the parent holds.

argv: ``nothing`` (no read-only file, TCP socket, executor thread, LMDB environment or writable
HDF5 file in the parent), ``held`` (a read-only file and a connected TCP socket the Dataset holds)
or ``elsewhere`` (a read-only file only the parent holds, in a global).
Prints one JSON line: {"ran": [<backend modules whose code ran in worker 0's fork hooks>]}.
"""

import json
import os
import socket
import sys
import tempfile

# Registered before safeloader's: in a child, runs before its after_in_child callbacks.
ran: set[str] = set()


def _profile(frame, event, arg):
    if event == "call" and "/safeloader/backends/" in frame.f_code.co_filename:
        ran.add(os.path.basename(frame.f_code.co_filename)[:-3])


os.register_at_fork(after_in_child=lambda: sys.setprofile(_profile))

import torch  # noqa: E402

from safeloader import DataLoader  # noqa: E402

mode = sys.argv[1]
held = []
if mode in ("held", "elsewhere"):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(b"x" * 100)
    held.append(open(f.name, "rb"))
    os.unlink(f.name)
if mode == "held":
    server = socket.create_server(("127.0.0.1", 0))
    held += [server, socket.create_connection(server.getsockname())]
read, write = os.pipe()


def report(worker_id: int) -> None:  # after every fork hook, before any item
    sys.setprofile(None)
    if worker_id == 0:
        os.write(write, json.dumps(sorted(ran)).encode())


class Items(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.held = held if mode == "held" else []

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


assert list(DataLoader(Items(), batch_size=2, num_workers=2, worker_init_fn=report)) is not None
print(json.dumps({"ran": json.loads(os.read(read, 65536))}))
