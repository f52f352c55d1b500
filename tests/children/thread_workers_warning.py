"""A loader told to use torch's upcoming thread workers (no fork): prints the warnings it gave."""

import warnings

from safeloader import DataLoader

loader = DataLoader(list(range(4)), num_workers=2)
loader.worker_method = "thread"  # torch's upcoming thread workers (no fork); this torch ignores it
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert sorted(int(x) for x in loader) == [0, 1, 2, 3]
print([str(w.message) for w in caught])
