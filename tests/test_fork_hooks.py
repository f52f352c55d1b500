"""Hooks run in the right process and phase, once per worker fork, in pthread_atfork order."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

import safeloader
from safeloader import DataLoader, HookError

pytestmark = [pytest.mark.usefixtures("clean_registry"), pytest.mark.timeout(60)]


class WhoReads(Dataset):
    """Item i is (i, pid of the process that read it, its worker id)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int):
        info = get_worker_info()
        return index, os.getpid(), -1 if info is None else info.id


class Recorder:
    """Hooks that append 'name phase pid worker_id' to a file (O_APPEND: one write, one line)."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def hook(self, name: str, **kwargs) -> safeloader.Hook:
        def record(phase: str):
            def callback() -> None:
                context = safeloader.fork_context()
                worker = context.worker_id if context is not None else "none"
                line = f"{name} {phase} {os.getpid()} {worker}\n".encode()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)

            return callback

        phases = ("before", "after_in_parent", "after_in_child")
        return safeloader.register_at_fork(name=name, **{phase: record(phase) for phase in phases}, **kwargs)

    def events(self) -> list[tuple[str, str, int, str]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [(n, ph, int(pid), w) for n, ph, pid, w in (line.split() for line in f)]


def worker_pids(batches) -> dict[int, int]:
    """worker id -> pid, from what the workers returned."""
    return {int(w): int(p) for batch in batches for _, p, w in zip(*batch)}


@pytest.mark.parametrize("num_workers", [1, 2, 3, 4])
@pytest.mark.parametrize("persistent", [False, True])
def test_each_phase_runs_once_per_worker_in_the_right_process(tmp_path, num_workers, persistent):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.a")
    loader = DataLoader(WhoReads(), batch_size=2, num_workers=num_workers, persistent_workers=persistent)
    epochs = 3
    pids_per_epoch = []
    for _ in range(epochs):
        batches = list(loader)
        pids_per_epoch.append(worker_pids(batches))
    del loader
    events = recorder.events()
    forks = 1 if persistent else epochs
    assert len(events) == 3 * num_workers * forks

    me = os.getpid()
    for phase in ("before", "after_in_parent"):
        in_phase = [e for e in events if e[1] == phase]
        assert {pid for _, _, pid, _ in in_phase} == {me}
        assert sorted(int(w) for *_, w in in_phase) == sorted(list(range(num_workers)) * forks)
    child = [(int(w), pid) for _, phase, pid, w in events if phase == "after_in_child"]
    expected = sorted((w, pid) for pids in (pids_per_epoch[:1] if persistent else pids_per_epoch)
                      for w, pid in pids.items())
    assert sorted(child) == expected  # once in each worker, with its own id
    if persistent:
        assert all(p == pids_per_epoch[0] for p in pids_per_epoch)


def test_a_callback_that_takes_one_argument_is_handed_its_forks_context_in_each_phase(tmp_path):
    # Issue 40: the context is passed, as pluggy passes declared arguments; a callback of
    # os.register_at_fork's shape (no arguments) reads it from fork_context() (the test above).
    path = str(tmp_path / "events")

    def record(phase: str):
        def callback(ctx: safeloader.ForkContext) -> None:
            assert ctx == safeloader.fork_context()  # the same fork's
            line = f"{phase} {os.getpid()} {ctx.worker_id} {ctx.num_workers} {ctx.options.freeze_gc}\n".encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

        return callback

    phases = ("before", "after_in_parent", "after_in_child")
    safeloader.register_at_fork(name="t.ctx", **{phase: record(phase) for phase in phases})
    batches = list(DataLoader(WhoReads(), batch_size=2, num_workers=2, freeze_gc=False))
    with open(path) as f:
        events = [line.split() for line in f]
    me, pids = str(os.getpid()), {str(pid) for pid in worker_pids(batches).values()}
    for phase in phases:
        in_phase = [e for e in events if e[0] == phase]
        assert sorted(e[2] for e in in_phase) == ["0", "1"], events  # once per worker, its own id
        assert all(e[3] == "2" and e[4] == "False" for e in in_phase), events  # the loader's options
        assert {e[1] for e in in_phase} == ({me} if phase != "after_in_child" else pids), events


def test_order_matches_pthread_atfork_with_first_hooks_first(tmp_path):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.first")
    recorder.hook("t.second")
    recorder.hook("t.urgent", first=True)
    list(DataLoader(WhoReads(), batch_size=16, num_workers=1))
    events = recorder.events()
    phases = ("before", "after_in_parent", "after_in_child")
    order = {phase: [n for n, ph, _, _ in events if ph == phase] for phase in phases}
    assert order["after_in_parent"] == ["t.urgent", "t.first", "t.second"]
    assert order["after_in_child"] == ["t.urgent", "t.first", "t.second"]
    assert order["before"] == ["t.second", "t.first", "t.urgent"]
    assert [ph for _, ph, _, _ in events][:3] == ["before"] * 3  # all of before precedes the fork


def test_hooks_do_not_fire_for_plain_fork_or_subprocess(tmp_path):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.loader_only")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert recorder.events() == []


def test_plain_torch_loader_is_not_armed_without_install(tmp_path):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.loader_only")
    list(torch.utils.data.DataLoader(WhoReads(), num_workers=2))
    assert recorder.events() == []


def test_every_fork_hook_fires_for_plain_fork(tmp_path):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.every", every_fork=True)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    phases = sorted((ph, w) for _, ph, _, w in recorder.events())
    assert phases == [("after_in_child", "none"), ("after_in_parent", "none"), ("before", "none")]


def test_disabled_hook_does_not_run(tmp_path):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.off")
    safeloader.disable("t.off")
    list(DataLoader(WhoReads(), num_workers=2))
    assert recorder.events() == []


def test_hook_disabled_for_one_loader_only(tmp_path):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.some")
    list(DataLoader(WhoReads(), num_workers=1, disable_hooks=["t.some"]))
    assert recorder.events() == []
    list(DataLoader(WhoReads(), num_workers=1))
    assert len(recorder.events()) == 3


def test_requires_gates_on_import(tmp_path):
    recorder = Recorder(tmp_path / "events")
    recorder.hook("t.needs", requires=("a_module_nobody_imports",))
    list(DataLoader(WhoReads(), num_workers=1))
    assert recorder.events() == []


def boom() -> None:
    raise ValueError("boom from hook")


@pytest.mark.parametrize("phase", ["before", "after_in_parent"])
@pytest.mark.parametrize("persistent", [False, True])
def test_raising_parent_callback_fails_the_loader_with_context(phase, persistent):
    safeloader.register_at_fork(name="t.bad", **{phase: boom})
    loader = DataLoader(WhoReads(), num_workers=2, persistent_workers=persistent)
    start = time.monotonic()
    with pytest.raises(HookError) as info:
        iter(loader)
    assert time.monotonic() - start < 10
    error = info.value
    assert error.hook == "t.bad" and error.phase == phase
    assert f"'t.bad' failed in phase '{phase}'" in str(error)
    assert isinstance(error.__cause__, ValueError) and "boom from hook" in str(error.__cause__)


@pytest.mark.parametrize("worker_id", [0, 2])
def test_raising_child_callback_reaches_parent_with_worker_id(worker_id):
    def fail_in_one_worker() -> None:
        if safeloader.fork_context().worker_id == worker_id:
            raise ValueError("boom in worker")

    safeloader.register_at_fork(after_in_child=fail_in_one_worker, name="t.child_bad")
    iterator = iter(DataLoader(WhoReads(), batch_size=1, num_workers=3))
    start = time.monotonic()
    with pytest.raises(HookError) as info:
        list(iterator)
    assert time.monotonic() - start < 10
    # The error's traceback keeps the iterator alive; stop its workers now
    # rather than when the cycle is collected.
    iterator._shutdown_workers()
    message = str(info.value)
    assert f"'t.child_bad' failed in phase 'after_in_child' in DataLoader worker {worker_id}" in message
    assert "boom in worker" in message


def test_user_worker_init_fn_runs_once_per_worker_after_seeding(tmp_path):
    path = str(tmp_path / "init")

    def init(worker_id: int) -> None:
        info = get_worker_info()
        with open(path, "a") as f:
            f.write(f"{worker_id} {info.id} {info.seed} {torch.initial_seed()} {os.getpid()}\n")

    loader = DataLoader(WhoReads(), num_workers=3, worker_init_fn=init)
    batches = list(loader)
    assert loader.worker_init_fn is init  # the user's attribute is untouched
    with open(path) as f:
        rows = [line.split() for line in f]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2]
    assert all(r[0] == r[1] and r[2] == r[3] for r in rows)  # right id, torch already seeded
    pids = worker_pids(batches)
    assert {int(r[0]): int(r[4]) for r in rows} == pids


def test_fork_context_is_none_around_a_plain_fork_inside_a_worker(tmp_path):
    """An every_fork hook running around a worker's own fork sees no DataLoader fork."""
    path = str(tmp_path / "seen")

    def record() -> None:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {safeloader.fork_context() is None}\n")

    safeloader.register_at_fork(before=record, name="t.every_before", every_fork=True)

    class ForksInWorker(Dataset):
        def __len__(self) -> int:
            return 1

        def __getitem__(self, index: int) -> int:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            return os.getpid()

    worker_pid = int(next(iter(DataLoader(ForksInWorker(), batch_size=None, num_workers=1))))
    with open(path) as f:
        seen = dict(line.split() for line in f)
    assert seen[str(worker_pid)] == "True"  # the worker's own plain fork
    assert seen[str(os.getpid())] == "False"  # the DataLoader fork in the parent
