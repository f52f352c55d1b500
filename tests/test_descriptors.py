"""The descriptor table a worker's fork hooks read is listed by the parent right before the fork.

A fresh process pays about 0.3 ms to list its own /proc/self/fd, so the parent
lists it in the fork's ``before`` phase and the worker inherits the list. These
tests check that a worker uses that list, lists its own when the parent made
none, and acts on what a descriptor is at the fork, not at the listing.
"""

from __future__ import annotations

import pytest

from .subproc import check_python

pytestmark = pytest.mark.timeout(120)


def test_a_worker_reads_the_table_its_parent_listed_and_lists_its_own_otherwise() -> None:
    code = """
import os
import safeloader
from safeloader.backends import _descriptors

scans = []
real_scan = _descriptors.scan
_descriptors.scan = lambda: (scans.append(os.getpid()), real_scan())[1]

def probe():  # a worker hook that reads the table twice, as "sockets" and "files" do
    table = _descriptors.at_fork()
    again = _descriptors.at_fork()
    own = [pid for pid in scans if pid == os.getpid()]
    probe.seen = f"{len(own)} {again is table} {len(table) > 0}"

safeloader.register_at_fork(after_in_child=probe, name="test.probe", last=True)

def worker_scans(disable):
    loader = safeloader.DataLoader([0], batch_size=None, num_workers=1, disable_hooks=disable,
                                   worker_init_fn=lambda _: None, collate_fn=lambda _: probe.seen)
    (seen,) = list(loader)
    return f"{seen} parent listed {len([pid for pid in scans if pid == os.getpid()])}"

print(worker_scans(()))  # nothing for "files" or "sockets" to do: the parent lists nothing
import socket
server = socket.create_server(("127.0.0.1", 0))
held = socket.create_connection(server.getsockname())  # a TCP connection: "sockets" has work in the worker
scans.clear()
print(worker_scans(()))
scans.clear()
print(worker_scans(("files", "sockets")))
"""
    nothing, recorded, unrecorded = check_python(code, timeout=60).stdout.split("\n")[:3]
    assert nothing == "1 True True parent listed 0"  # no hook needed it in the parent: the worker listed once
    assert recorded == "0 True True parent listed 1"  # the parent's list, once: the worker listed nothing
    assert unrecorded == "1 True True parent listed 0"  # no list from the parent: the worker listed once


@pytest.mark.parametrize("shards", [0, 100])
def test_a_file_swapped_under_the_same_descriptor_after_the_listing_is_read_as_the_new_file(shards: int) -> None:
    """A parent thread may replace a descriptor between the parent's listing and the fork;
    the worker must give it the new file's own offset, not the offset listed for the old one.
    With 100 more files held, the identities are read by the parent's lock reader thread."""
    code = f"SHARDS = {shards}\n" + """
import os, tempfile
import safeloader, torch

directory = tempfile.mkdtemp()
old_path, new_path = os.path.join(directory, "old"), os.path.join(directory, "new")
with open(old_path, "wb") as f:
    f.write(b"o" * 4096)
with open(new_path, "wb") as f:
    f.write(bytes(range(256)) * 16)

old = open(old_path, "rb", buffering=0)
old.seek(1000)  # the offset the parent lists for this descriptor
new = os.open(new_path, os.O_RDONLY)
os.lseek(new, 7, os.SEEK_SET)  # the new file's offset at the fork

def swap():  # runs after the "files" and "sockets" hooks listed the table (first=True: later in `before`)
    os.dup2(new, old.fileno())

safeloader.register_at_fork(before=swap, name="test.swap", first=True)

class Reader(torch.utils.data.Dataset):
    def __init__(self):
        self.old = old  # held by the Dataset: the "files" hook acts on it
        self.shards = [open(old_path, "rb") for _ in range(SHARDS)]
    def __len__(self):
        return 1
    def __getitem__(self, index):
        return os.pread(self.old.fileno(), 1, os.lseek(self.old.fileno(), 0, os.SEEK_CUR))

(item,) = list(safeloader.DataLoader(Reader(), batch_size=None, num_workers=1))
print(item[0], os.lseek(old.fileno(), 0, os.SEEK_CUR))
"""
    byte, parent_offset = check_python(code, timeout=60).stdout.split()
    assert int(byte) == 7  # the new file, at its own offset at the fork (1000 would give 1000 % 256 = 232)
    assert int(parent_offset) == 7  # the parent's description is untouched
