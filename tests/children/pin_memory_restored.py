"""install() arms torch's loader, whose armed start installs the pin_memory gate; uninstall()
(twice) restores torch's own function. Prints ``restored``."""

import torch.utils.data._utils.pin_memory as pin_module

original = pin_module.pin_memory
import torch.utils.data  # noqa: E402

import safeloader  # noqa: E402

safeloader.install()
batches = list(torch.utils.data.DataLoader(range(8), batch_size=2, num_workers=2))
assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]], batches
assert pin_module.pin_memory is not original, "the armed start did not install the gate"
safeloader.uninstall()
assert pin_module.pin_memory is original, pin_module.pin_memory
safeloader.uninstall()  # harmless twice
assert pin_module.pin_memory is original
print("restored")
