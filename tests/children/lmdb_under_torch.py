"""An LMDB environment opened in __init__, read for an epoch by torch's own DataLoader (2 workers).

argv: the environment's path. Prints ``RESULT ok`` or ``RESULT <error type> <error>``.
"""

import sys

import torch.utils.data

from tests.lmdb_data import LmdbRecords, epoch

dataset = LmdbRecords(sys.argv[1])
try:
    epoch(torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2))
    print("RESULT ok")
except Exception as exc:
    print("RESULT", type(exc).__name__, exc)
