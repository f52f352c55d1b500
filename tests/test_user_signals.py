"""safeloader never takes a signal the user (or faulthandler, pytest-timeout...) holds, leaves
none changed, and never waits for another thread's fork or its at-fork callbacks.

Each case runs in a child under a deadline (tests/children/user_signals.py,
tests/children/fork_in_other_thread.py), under torch's DataLoader beside safeloader's.
"""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from .subproc import check_python, run_script, run_stopped

pytestmark = pytest.mark.timeout(240)


def _result(script: str, loader: str, case: str, timeout: float = 90) -> dict:
    result = run_script(script, loader, case, timeout=timeout)
    assert not result.timed_out and result.returncode == 0, f"{loader} ({case}) did not end cleanly:\n{result}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["workers", "init"])
def test_user_handlers_on_realtime_signals_run_in_workers(case):
    # The user's Python handler on SIGRTMIN+2 and faulthandler on SIGRTMIN+3, installed before
    # the loader (inherited) or in worker_init_fn: each of the 8 items signals its own worker.
    torch = _result("user_signals.py", "torch", case)
    assert torch["handled"] == 8 and torch["dumps"] == 8, torch
    ours = _result("user_signals.py", "safeloader", case)
    assert ours["handled"] == 8 and ours["dumps"] == 8, ours


def test_a_parent_handler_that_raises_raises_at_once_in_a_worker_as_under_torch():
    # A start wraps the Python handlers so that what one raises (Ctrl-C) waits for the start's end.
    # The workers forked meanwhile inherited the wrappers: a SIGALRM per-item timeout set in the
    # parent was kept back there and raised 2 s later, in another item (or the worker's idle loop).
    out = check_python(
        """
        import signal, time
        import torch, safeloader

        class ItemTimeout(Exception):
            pass

        def on_alarm(signum, frame):
            raise ItemTimeout()

        signal.signal(signal.SIGALRM, on_alarm)

        class Items(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, index):
                signal.setitimer(signal.ITIMER_REAL, 0.3)
                try:
                    time.sleep(1.0 if index == 2 else 0.05)
                    return str(index)
                except ItemTimeout:
                    return f"{index} timed out"
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)

        for loader_class in (torch.utils.data.DataLoader, safeloader.DataLoader):
            print(list(loader_class(Items(), batch_size=None, num_workers=2)), flush=True)
        """,
        timeout=60,
    ).stdout
    expected = str(["0", "1", "2 timed out", "3", "4", "5", "6", "7"])
    assert out.splitlines() == [expected, expected], out


# A sampler that handles its own signals inside iter(loader), where torch draws the first indices
# (tests/children/signal_in_sampler.py): a setitimer time bound (SIGALRM raising Timeout) or a
# SIGUSR1 "reload", each caught by the sampler. Issue 42, item 5: the start used to keep the
# handler's exception back for its end, so the sampler searched on until the signal was sent again
# 2 s later (the handler ran twice) and iter(loader) raised the exception the sampler had caught.
@pytest.mark.parametrize("mode", ["alarm", "reload"])
def test_a_handler_the_sampler_catches_raises_where_its_signal_lands_and_never_again(mode):
    expected = {"handled": 1, "caught": 1, "raised": None, "epoch": [[0, 1], [2, 3], [4, 5], [6, 7]]}
    for loader in ("torch", "safeloader"):
        result = _result("signal_in_sampler.py", loader, mode, timeout=60)
        if result != expected:
            # Once in CI (Python 3.13, heavily loaded 2 cores) torch's own run saw its alarm's Timeout
            # outside the sampler's try (caught 0, raised 'Timeout'): not understood yet, so a second
            # run is allowed; safeloader's old deferral failed every run (the handler ran twice).
            result = _result("signal_in_sampler.py", loader, mode, timeout=60)
        assert result == expected, (loader, result)


def test_faulthandler_registration_in_the_parent_is_kept_after_loaders():
    # Before: safeloader looked at the polars pool's native stacks on SIGRTMIN+3 and then put
    # SIG_DFL back, so the user's faulthandler registration was gone: the signal killed the process.
    pytest.importorskip("polars")
    for loader in ("torch", "safeloader"):
        result = _result("user_signals.py", loader, "parent")
        assert result["dumps"] == 2 and result["items"] == list(range(24)), (loader, result)


def test_stall_report_uses_signals_nobody_holds_and_never_runs_a_user_handler():
    # The user holds SIGRTMIN+2 and +3; worker_init_fn takes a signal the worker found free at
    # its fork. The hang is still named with the worker's Python stack, and no user handler runs.
    result = _result("user_signals.py", "safeloader", "stall")
    assert result["stall"] and "Stuck in __getitem__" in result["stall"], result
    assert "user_signals.py" in result["stall"] and result["dumps"] == 0, result


@pytest.mark.torch_baseline
def test_torch_hangs_on_the_stall_case():
    result = run_script("user_signals.py", "torch", "stall", timeout=8)
    assert result.timed_out, f"torch's DataLoader was expected to hang on item 5:\n{result}"


def _stopped_mid_second_epoch(loader: str, seconds: float, case: str = "sigcont") -> dict:
    """Run the ``sigcont`` case (or ``case``); stop its process group (as Ctrl-Z does) for ``seconds``
    one second into the second epoch, then continue it."""
    code, output = run_stopped("user_signals.py", loader, case, marker="epoch2", delay=1.0, seconds=seconds)
    assert code == 0, f"{loader}: exit {code}\n{output}"
    return json.loads(output.strip().splitlines()[-1])


def test_a_user_sigcont_handler_installed_after_a_loader_causes_no_false_stall():
    # stall_timeout=2 s (first item 4 s); stopped 5 s mid-epoch after the user took SIGCONT.
    # Before: safeloader's SIGCONT handler was replaced, the stop counted, a false WorkerStallError.
    # Both loaders at once, each in its own process group (stopped on its own): 15 s, not 30.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        loaders = ("torch", "safeloader")
        results = dict(zip(loaders, pool.map(_stopped_mid_second_epoch, loaders, (5.0, 5.0))))
    for loader, result in results.items():
        assert result["stall"] is None and result["items"] == list(range(24)), (loader, result)
        assert result["cont"] >= 1, (loader, result)  # the user's handler still sees the continue


@pytest.mark.parametrize("case", ["sigcont-before", "sigcont"])
def test_a_seven_second_stop_with_a_user_sigcont_handler_is_not_a_stall(case):
    # Issue 42, item 8: a user's SIGCONT handler installed before or after the first loader, the
    # process group stopped 7 s (stall_timeout=2 s, first item 4 s). Torch's loader beside it.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        loaders = ("torch", "safeloader")
        results = dict(zip(loaders, pool.map(_stopped_mid_second_epoch, loaders, (7.0, 7.0), (case, case))))
    for loader, result in results.items():
        assert result["stall"] is None and result["items"] == list(range(24)), (loader, result)
        assert result["cont"] >= 1, (loader, result)


@pytest.mark.parametrize("case", ["slow", "rlock"])
def test_another_threads_fork_held_in_its_callbacks_does_not_hold_up_the_loader(case):
    # Another thread is inside its own at-fork `before` callback (registered before safeloader
    # was imported, so inside safeloader's) for as long as the main thread runs its epochs:
    # "slow" waits for them to end, "rlock" waits for an RLock a third thread holds until then.
    # Before: safeloader's worker forks (and its warm_backtrace) waited for that fork: a deadlock.
    for loader in ("torch", "safeloader"):
        result = _result("fork_in_other_thread.py", loader, case, timeout=45)
        assert result["epochs"] == [16, 16, 16], (loader, result)
        assert result["in_callback_after"], (loader, result)  # done while the other fork was held
