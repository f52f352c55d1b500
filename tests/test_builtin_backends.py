"""The built-in backends: each is its module, found by listing the package, and runs around a fork
where its declarations (``first``, ``last``, ``runs_after``) put it, whatever order they register in."""

from __future__ import annotations

import importlib
import json
import os
import sys
import types

import pytest

import safeloader
from safeloader import backends, hook_names
from safeloader.backends import Backend

from .subproc import check_python

pytestmark = pytest.mark.usefixtures("clean_registry")

# The hooks of the backends whose `before` reads forkstate's record of the parent's threads.
READS_THE_RECORD = ("forkstate", "threadpools", "polars", "zarrs")


def builtin_order(names: list[str]) -> list[str]:
    builtin = {_module(name).NAME for name in backends.BUILTIN} | {hook_names.WATCHDOG}
    return [name for name in names if name in builtin]


def _module(name: str):
    return importlib.import_module(f"safeloader.backends.{name}")


def check_order(names: list[str], first: set[str]) -> None:
    """What the built-ins rely on, each constraint where the code says why."""
    order = builtin_order(names)
    at = order.index
    # The watchdog's after_in_child first: a hang in any later hook is diagnosed with stacks (watchdog._worker).
    assert order[0] == "watchdog"
    # pin_memory's `before` right before the fork, only the watchdog's clock after it: pin threads wait briefly.
    assert order[1] == "pin_memory"
    # sockets first among the data backends: a later hook closing a TLS connection writes into the stand-in.
    assert order[2] == "sockets"
    # h5py makes writable files read-only before files privatizes the read-only descriptors; lmdb and pyav
    # reopen through the descriptors files gave the worker.
    assert at("h5py") < at("files") < min(at("lmdb"), at("pyav"))
    # The plain hooks' child phases may read files through those descriptors: every first hook before them.
    plain = [name for name in order if name not in first]
    assert all(at(early) < at(name) for early in first & set(order) for name in plain), order
    # blosc2's `before` first of all: its threads are stopped before forkstate's record lists the parent's.
    assert order[-1] == "blosc2"
    assert all(at(name) < at("blosc2") for name in READS_THE_RECORD)


def test_every_public_module_of_the_package_is_a_registered_backend():
    folder = os.path.dirname(backends.__file__)
    modules = sorted(entry[:-3] for entry in os.listdir(folder) if entry.endswith(".py") and entry[0] != "_")
    assert backends.BUILTIN == tuple(modules)
    registered = {hook.name for hook in safeloader.hooks()}
    for name in modules:
        module = _module(name)
        assert isinstance(module.BACKEND, Backend), name
        assert module.BACKEND.name == module.NAME  # its name comes from its own module
        assert module.NAME in registered or not module.BACKEND.has_hook(), name


def test_a_module_is_found_by_its_name_alone(tmp_path):
    for entry in ("newlib.py", "_helper.py", "__init__.py", "notes.txt", "older.py"):
        (tmp_path / entry).write_text("")
    (tmp_path / "sub").mkdir()
    assert backends.discover(str(tmp_path)) == ("newlib", "older")


def test_a_module_without_a_backend_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(backends, "BUILTIN", ("helper",))
    monkeypatch.setitem(sys.modules, "safeloader.backends.helper", types.ModuleType("safeloader.backends.helper"))
    with pytest.raises(safeloader.RegistrationError, match="must define BACKEND"):
        backends.register_builtin()


def test_every_name_of_hook_names_is_a_built_in_hook_that_disable_hooks_accepts():
    hooks = {hook.name for hook in safeloader.hooks()}
    constants = {value for key, value in vars(hook_names).items() if key.isupper()}
    assert constants <= hooks
    safeloader.DataLoader(list(range(4)), num_workers=1, disable_hooks=sorted(constants))  # each accepted


def test_a_backend_without_fork_phases_is_no_hook_and_disable_hooks_refuses_its_name():
    # npz only pickles archives for spawn/forkserver workers; under fork the "files" hook gives each
    # worker its own offset in the archive, so that is the name that turns it off.
    npz = next(backend for backend in backends.registered() if backend.name == "npz")
    assert not npz.has_hook() and "npz" not in {hook.name for hook in safeloader.hooks()}
    with pytest.raises(ValueError, match=r"registered hooks \(.*files.*\), got unknown 'npz'"):
        safeloader.DataLoader(list(range(4)), num_workers=1, disable_hooks=("npz",))


def test_the_built_in_order_keeps_what_each_hook_relies_on():
    hooks = safeloader.hooks()
    check_order([hook.name for hook in hooks], {hook.name for hook in hooks if hook.first})


def test_the_order_comes_from_declarations_not_from_the_order_of_registration():
    # Registered again, the other way round (later registrations win ties): every constraint still holds.
    result = check_python(
        """
import json, safeloader
from safeloader import backends, watchdog
for backend in reversed(backends.registered()):
    backend.register()
watchdog.register()
hooks = safeloader.hooks()
print(json.dumps([[hook.name for hook in hooks], [hook.name for hook in hooks if hook.first]]))
""",
        timeout=60,
    )
    assert result.returncode == 0, result
    names, first = json.loads(result.stdout.strip().splitlines()[-1])
    check_order(names, set(first))
    assert builtin_order(names) != builtin_order([hook.name for hook in safeloader.hooks()])  # ties did move
