"""install()/uninstall() from several threads while loaders start (issue 42, item 6).

argv: ``arm``, ``toggle`` or ``mid_start``; ``safeloader`` (install() is called) or ``torch``
(the same threads and starts, never installed); rounds; workers per loader.

- ``arm``: each round, 4 trainer threads call ``safeloader.install()`` at once and start a
  loader of torch's class (imported before); then the main thread starts one, uninstalls,
  and starts one more. A round fails if any start raises.
- ``toggle``: one thread calls install() and uninstall() over and over while the main
  thread starts ``rounds`` loaders of torch's class; each failed start counts (with one
  worker each, 5-6 of 40-60 starts failed before the fix: slow, so not run by the tests).
- ``mid_start``: a loader of torch's class starts in another thread and is held inside its
  armed start (a backend's ``prepare_start`` waits) while the main thread uninstalls; then
  it goes on. Once per round.

The thread switch interval is shortened (1 us) so that the races the issue saw now and then
(25-35 rounds of 300 with 4 trainer threads) show in a few seconds: 40-60 of 300 before the fix. A broken round is
repaired by hand (torch's class given its own method back), so every round counts.
Prints ``failed <k> of <n>`` and the first failure.
"""

import importlib
import sys
import threading

import torch.utils.data
import torch.utils.data.dataloader
from torch.utils.data import DataLoader as TorchDataLoader

import safeloader

mode, which, rounds, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
armed = which == "safeloader"
TORCH_CLASS = torch.utils.data.dataloader.DataLoader
TORCH_GET_ITERATOR = TORCH_CLASS.__dict__["_get_iterator"]
DATA = list(range(4))


def start() -> None:
    assert list(TorchDataLoader(DATA, num_workers=workers)) == [torch.tensor([i]) for i in DATA]


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:100]}"


def repair() -> None:
    """Give torch back its own class and method and forget safeloader's installation."""
    TORCH_CLASS._get_iterator = TORCH_GET_ITERATOR
    if "__reduce_ex__" in TORCH_CLASS.__dict__:
        del TORCH_CLASS.__reduce_ex__
    torch.utils.data.DataLoader = torch.utils.data.dataloader.DataLoader = TORCH_CLASS
    safeloader._context.set_installed(False)
    importlib.reload(sys.modules["safeloader._install"])  # its saved state, as at import


def arm_round() -> list[str]:
    errors: list[str] = []
    barrier = threading.Barrier(4)

    def trainer() -> None:
        barrier.wait()
        try:
            if armed:
                safeloader.install()
            start()
        except BaseException as exc:
            errors.append("trainer start: " + describe(exc))

    threads = [threading.Thread(target=trainer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for step in ("installed", "uninstalled"):
        if step == "uninstalled" and armed:
            safeloader.uninstall()
        try:
            start()
        except BaseException as exc:
            errors.append(f"start {step}: " + describe(exc))
    return errors


def toggle() -> tuple[int, list[str]]:
    done = threading.Event()

    def toggler() -> None:
        while not done.is_set():
            safeloader.install()
            safeloader.uninstall()

    thread = threading.Thread(target=toggler) if armed else None  # torch alone: the same starts
    if thread is not None:
        thread.start()
    errors = []
    for _ in range(rounds):
        try:
            start()
        except BaseException as exc:
            errors.append(describe(exc))
            done.set()
            if thread is not None:
                thread.join()
            repair()
            done.clear()
            if thread is not None:
                thread = threading.Thread(target=toggler)
                thread.start()
    done.set()
    if thread is not None:
        thread.join()
    return len(errors), errors


class HoldTheStart(safeloader.Backend):
    """Holds an armed start, after safeloader's checks and before torch's own method runs."""

    name = "t.hold"
    description = "holds a loader's start until the main thread lets it go"
    entered = threading.Event()
    released = threading.Event()

    def prepare_start(self, loader, options, start_method):
        self.entered.set()
        assert self.released.wait(30), "never let go"


def uninstall_mid_start() -> list[str]:
    errors: list[str] = []
    HoldTheStart.entered.clear()
    HoldTheStart.released.clear()
    if armed:
        safeloader.install()

    def trainer() -> None:
        try:
            start()
        except BaseException as exc:
            errors.append("start under way: " + describe(exc))

    thread = threading.Thread(target=trainer)
    thread.start()
    if armed:
        assert HoldTheStart.entered.wait(30), "the start never reached its backends"
        safeloader.uninstall()
    HoldTheStart.released.set()
    thread.join()
    try:
        start()
    except BaseException as exc:
        errors.append("start after: " + describe(exc))
    return errors


sys.setswitchinterval(1e-6 if mode == "arm" else 0.005)
if mode in ("arm", "mid_start"):
    if mode == "mid_start":
        safeloader.register_backend(HoldTheStart)
    failures = []
    for _ in range(rounds):
        errors = arm_round() if mode == "arm" else uninstall_mid_start()
        if errors:
            failures.append(errors)
            repair()
    print(f"failed {len(failures)} of {rounds}", failures[0] if failures else "")
else:
    failed, errors = toggle()
    print(f"failed {failed} of {rounds}", errors[:1])
sys.setswitchinterval(0.005)
print("torch restored:", TORCH_CLASS.__dict__["_get_iterator"] is TORCH_GET_ITERATOR and not safeloader.installed())
