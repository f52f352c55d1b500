"""The same Dataset under torch's own DataLoader, in a fresh interpreter: 4 workers read random items.

argv: ``module:function`` (called with the remaining arguments, it returns
``(dataset, expected)``), seconds of reading, then the function's arguments.
Prints ``RESULT <items read> <wrong items> <repr of the first error>``.
"""

import importlib
import sys
import warnings

warnings.simplefilter("ignore")
import torch.utils.data  # noqa: E402

from tests.helpers import count_failures, random_loader  # noqa: E402

case, seconds, *args = sys.argv[1:]
module, function = case.split(":")
dataset, expected = getattr(importlib.import_module(module), function)(*args)
checked, wrong, error = count_failures(random_loader(torch.utils.data.DataLoader, dataset), expected, float(seconds))
print("RESULT", checked, wrong, repr(error))
