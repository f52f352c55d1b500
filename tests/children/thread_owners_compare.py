"""Which library started each native thread: read from the loader's list of code and the kernel's
answer for one stack (PROCMAP_QUERY), from /proc/self/maps where the kernel has no such request,
and from /proc/self/maps alone (the old reading, the oracle). Prints the three as JSON.

OpenBLAS's pool (numpy) is started by a product big enough to use its threads.
"""

import json
import os
import time

import numpy

from safeloader import native
from safeloader.diagnostics import thread_owners

numpy.ones((512, 512)) @ numpy.ones((512, 512))
time.sleep(0.5)  # OpenBLAS's threads spin for about 0.1 s after work before they block (then readable)
threads = tuple(native.thread_census().foreign)


def attributed() -> dict[int, str | None]:
    thread_owners._owners = (0, {})  # found afresh: owners() keeps what it found
    return thread_owners.owners(threads)  # waits for a pool thread still spinning after the product


found = attributed()
queried = thread_owners._procmap_query
thread_owners._procmap_query = False  # as on a kernel older than 6.11
without_query = attributed()

with open("/proc/self/maps", "rb") as maps:
    all_starts, all_ends, starts, ends, names = native.parse_maps(maps.read())
segments = thread_owners._Segments()
segments.starts, segments.ends, segments.names = starts, ends, names
segments._resolved = {name: name for name in names}  # the kernel's paths are resolved already
segments.all_starts, segments.all_ends = all_starts, all_ends
segments.refresh = lambda: None
thread_owners._segments = segments
from_maps = attributed()
print(json.dumps({"found": found, "without_query": without_query, "from_maps": from_maps, "queried": queried,
                  "exe": os.readlink("/proc/self/exe")}))
