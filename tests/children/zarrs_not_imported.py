"""A safeloader loader in a program that never imports zarr: prints which of zarr/zarrs got
imported, and the zarrs backend's spare copy and resolved state (none of it: it costs nothing)."""

import sys

import safeloader
from safeloader.backends import zarrs as backend

assert not next(h for h in safeloader.hooks() if h.name == "zarrs").active
loader = safeloader.DataLoader(list(range(8)), batch_size=2, num_workers=2)
assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
print(sorted(m for m in ("zarr", "zarrs") if m in sys.modules), backend.BACKEND.spare_copy(),
      backend.BACKEND.resolved_modes())
