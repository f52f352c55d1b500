"""LMDB: environments a Dataset opened in the parent work in forked workers (why: docs/internals.md)."""

from __future__ import annotations

import sys
import weakref
from typing import Any

from .. import _hooks
from .._context import ForkContext
from .._options import Options
from ..errors import LmdbWritableError
from . import _reopen
from ._backend import Backend
from ._object_graph import find_instances
from .files import NAME as FILES

NAME = "lmdb"
_MAX_DBS = 64  # the parent's max_dbs cannot be read back; enough for a worker's open_db calls


Plan = list[tuple[Any, Any, Any, str, dict[str, Any]]]
"""[(holder, key, environment, path, open options)] of each environment a worker reopens."""


def plan_start(loader: Any, options: Options, start_method: str, plans: weakref.WeakKeyDictionary[Any, Plan]) -> None:
    """Before ``loader`` starts workers: refuse writable environments, plan the reopen in ``plans``."""
    if "lmdb" not in sys.modules or loader is None:
        return
    if start_method != "fork":
        import lmdb

        _reopen.register_reducer(lmdb.Environment, reduce_environment)
        return
    if not _hooks.hook_runs(NAME, options):
        plans.pop(loader, None)
        return
    import lmdb

    plan = []
    for holder, key, env in find_instances(getattr(loader, "dataset", None), lmdb.Environment):
        if not env.flags()["readonly"]:
            raise LmdbWritableError(
                f"the Dataset holds the LMDB environment {env.path()!r} open for writing; forked DataLoader "
                "workers must not use it (LMDB forbids using an environment after fork, and a worker closing it "
                "would disturb the parent's writer). Open it with lmdb.open(path, readonly=True) for the "
                "Dataset, or open it inside each worker"
            )
        plan.append((holder, key, env, env.path(), open_options(env)))
    plans[loader] = plan


def open_options(env: Any) -> dict[str, Any]:
    """The ``lmdb.open`` keywords that reopen ``env`` as it is (but ``max_dbs``, which cannot be read)."""
    flags = env.flags()
    options = {name: flags[name] for name in ("subdir", "readonly", "lock", "readahead", "meminit")}
    options.update(map_size=env.info()["map_size"], max_readers=env.max_readers(), max_dbs=_MAX_DBS)
    return options


def reduce_environment(env: Any) -> tuple[Any, ...]:
    """Pickle a read-only environment for a spawn/forkserver worker by path and options."""
    if not env.flags()["readonly"]:
        raise TypeError(
            f"safeloader does not reopen the writable LMDB environment {env.path()!r} in a DataLoader worker: "
            "open it with lmdb.open(path, readonly=True) for the Dataset, or open it inside each worker"
        )
    return reopen_environment, (env.path(), open_options(env))


def reopen_environment(path: str, options: dict[str, Any]) -> Any:
    """In a spawn/forkserver worker: the environment the parent pickled."""
    import lmdb

    def opener() -> Any:
        try:
            return lmdb.open(path, **options)
        except lmdb.Error as exc:
            raise OSError(f"lmdb: {exc}") from exc

    return _reopen.reopen_or_unavailable("LMDB environment", path, opener)


def reopen_environments(plan: Plan) -> None:
    """In a worker: open each planned environment afresh and put it where the inherited one was."""
    import lmdb

    fresh: dict[int, Any] = {}
    for holder, key, env, path, options in plan:
        if id(env) not in fresh:
            # py-lmdb allows one environment per path and process: close the
            # worker's inherited copy first. mdb_env_close in a child touches
            # only what the child owns (reader slots under its own pid, which
            # it has none of; its own fcntl locks, which fork does not
            # inherit), so the parent's environment is not disturbed.
            env.close()
            fresh[id(env)] = lmdb.open(path, **options)
        if isinstance(holder, (list, dict)):
            holder[key] = fresh[id(env)]
        else:
            holder.__dict__[key] = fresh[id(env)]


class LmdbBackend(Backend):
    name = NAME
    description = 'each worker opens its own copy of the LMDB environments the Dataset holds; writable ones refused'
    plan_per_start = True
    # Reopens environments once "files" gave the worker its own descriptors; before the plain backends.
    first = True
    runs_after = (FILES,)
    requires = ("lmdb",)

    def __init__(self) -> None:
        self._plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()  # loader -> its Plan

    def prepare_start(self, loader: Any, options: Options, start_method: str) -> None:
        plan_start(loader, options, start_method, self._plans)

    def before(self, ctx: ForkContext) -> Plan | None:
        if ctx is None or ctx.loader is None:
            return None
        return self._plans.get(ctx.loader) or self.NOTHING_TO_DO

    def after_in_child(self, ctx: ForkContext, plan: Plan | None) -> None:
        if plan:
            reopen_environments(plan)


BACKEND = LmdbBackend()
