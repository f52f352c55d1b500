"""A first loader's pin-memory thread pins batches while a second loader forks its workers, 20 times.

argv: safeloader|torch (whose DataLoader forks). Prints "20 loaders ok", or exits 3 with the
loader's error once a worker hangs (no batch within the loader's timeout).
"""

import ctypes
import os
import queue
import signal
import sys
import threading

import psutil
import torch
import torch.utils.data._utils.pin_memory as pin_module

which = sys.argv[1]
# Not imported for torch's loader: safeloader's C extension frees every fork child of the lock
# (csrc/exit_lock.c), torch's loader's workers included.
if which == "safeloader":
    import safeloader
libc = ctypes.CDLL(None)
cxa_atexit, cxa_finalize = libc.__cxa_atexit, libc.__cxa_finalize
cxa_atexit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
cxa_finalize.argtypes = [ctypes.c_void_p]
getpid = ctypes.cast(libc.getpid, ctypes.c_void_p).value
for _ in range(200_000):  # a long atexit list: scanning it holds glibc's lock for milliseconds
    cxa_atexit(getpid, None, 0x1000)


class Batch:
    """Pinning it does what pinning on an accelerator can do: hold glibc's atexit-list
    lock (taken by any first-time C++ static initialisation) with the GIL released."""

    def pin_memory(self):
        cxa_finalize(0x2000)  # matches no entry: a pure scan under the lock
        return self


# torch's own pin-memory loop, as a first loader runs it; this CPU-only torch has
# no accelerator, and setting the device is the loop's only other native call.
torch.accelerator.set_device_index = lambda index: None
done = threading.Event()
in_queue, out_queue = queue.Queue(4), queue.Queue()
threading.Thread(target=pin_module._pin_memory_loop, args=(in_queue, out_queue, 0, done, "cpu"), daemon=True).start()


def feed():
    while True:
        in_queue.put((0, Batch()))
        while not out_queue.empty():
            out_queue.get()


threading.Thread(target=feed, daemon=True).start()

# A second loader forks its workers meanwhile, over and over.
Loader = safeloader.DataLoader if which == "safeloader" else torch.utils.data.DataLoader
for attempt in range(20):
    try:
        batches = list(Loader(range(8), batch_size=2, num_workers=2, timeout=5))
    except RuntimeError as error:
        print(f"attempt {attempt}: {error}", flush=True)
        # torch's SIGCHLD handler would raise "worker killed by signal" here, mid-loop: replaced, not
        # only blocked (a SIGCHLD already caught would still run the Python handler; SIG_DFL runs none).
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        for worker in psutil.Process().children(recursive=True):
            worker.kill()  # the hung worker would hold our output pipes open
        os._exit(3)
    assert torch.cat(batches).tolist() == list(range(8))
print("20 loaders ok", flush=True)
os._exit(0)  # skip the 200000 atexit calls
