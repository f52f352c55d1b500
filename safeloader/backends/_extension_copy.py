"""A private copy of a native extension module for a forked worker, and the Python names that must follow it
(why: docs/internals.md)."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["Reference", "find_references", "load_copy", "make_copy", "rebind"]


def make_copy(source: str, label: str) -> int:
    """A close-on-exec descriptor of an unnamed file holding the bytes of ``source``; the caller owns it."""
    try:
        fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (AttributeError, OSError):  # no O_TMPFILE (or a filesystem without it): memory
        fd = os.memfd_create(f"safeloader-{label}", os.MFD_CLOEXEC)
    try:
        copy_into(fd, source)
    except BaseException:
        os.close(fd)
        raise
    return fd


def copy_into(fd: int, source: str) -> None:
    """Write the bytes of the file ``source`` to the descriptor ``fd`` (in the kernel: sendfile)."""
    with open(source, "rb") as library:
        size = os.fstat(library.fileno()).st_size
        offset = 0
        while offset < size:
            sent = os.sendfile(fd, library.fileno(), offset, size - offset)
            if sent == 0:
                raise OSError(f"copying {source} stopped at byte {offset} of {size}")
            offset += sent


def load_copy(name: str, fd: int) -> ModuleType:
    """Load the extension in ``fd`` as a new module ``name`` (``sys.modules`` is left as it was)."""
    path = f"/proc/self/fd/{fd}"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot make a module spec for {path}")
    previous = sys.modules.get(name)
    try:
        module = importlib.util.module_from_spec(spec)  # dlopen + the module's init function
        loader.exec_module(module)
    finally:
        # A single-phase extension enters itself in sys.modules when initialised;
        # nothing may change there until the caller has checked every binding.
        if previous is not None:
            sys.modules[name] = previous
    return module


@dataclass(frozen=True)
class Reference:
    """One place holding an object of the old module: ``container[key]`` (a namespace or a module-level
    dict) is the object at ``path`` in the module (``()`` the module, ``("PySeries", "new_str")`` a method)."""

    container: Any
    key: Any
    path: tuple[str, ...]
    where: str  # for messages: "polars.datatypes.constructor._POLARS_TYPE_TO_CONSTRUCTOR[Float64]"


def _owned(module: ModuleType) -> dict[int, tuple[str, ...]]:
    """id -> path of every object of ``module`` that Python code can hold."""
    owned: dict[int, tuple[str, ...]] = {id(module): ()}
    for name, value in vars(module).items():
        if name.startswith("__") or not isinstance(value, (type, types.BuiltinFunctionType)):
            continue  # ints, strings and None are shared by both copies
        owned[id(value)] = (name,)
        if isinstance(value, type):
            for attribute, member in vars(value).items():
                if isinstance(member, staticmethod):
                    owned[id(member.__func__)] = (name, attribute)
    return owned


def _path_of(value: object, owned: dict[int, tuple[str, ...]]) -> tuple[str, ...] | None:
    path = owned.get(id(value))
    if path is not None:
        return path
    if isinstance(value, types.BuiltinMethodType):  # a class method, bound to an old class
        owner = owned.get(id(getattr(value, "__self__", None)))
        if owner is not None and len(owner) == 1:
            return (*owner, value.__name__)
    return None


def find_references(module: ModuleType, packages: Iterable[str]) -> tuple[Reference, ...]:
    """Every reference to ``module``'s objects in the namespaces of ``packages`` (and their submodules),
    in their classes' namespaces and in their module-level dicts. Run in the parent."""
    owned = _owned(module)
    prefixes = tuple(packages)
    found: list[Reference] = []

    def visit_namespace(namespace: dict[str, Any], where: str, depth: int) -> None:
        for key, value in list(namespace.items()):
            path = _path_of(value, owned)
            if path is not None:
                found.append(Reference(namespace, key, path, f"{where}.{key}"))
            elif depth == 0 and isinstance(value, type) and (value.__module__ or "").startswith(prefixes):
                visit_namespace(_class_dict(value), f"{where}.{key}", 1)
            elif depth == 0 and type(value) is dict:
                for item_key, item in list(value.items()):
                    item_path = _path_of(item, owned)
                    if item_path is not None:
                        found.append(Reference(value, item_key, item_path, f"{where}.{key}[{item_key!r}]"))

    for name, loaded in list(sys.modules.items()):
        if loaded is None or loaded is module or not _in_packages(name, prefixes):
            continue
        visit_namespace(vars(loaded), name, 0)
    return tuple(found)


class _ClassNamespace(dict[str, Any]):
    """A class's namespace as a writable mapping (a class ``__dict__`` is a read-only proxy)."""

    def __init__(self, cls: type) -> None:
        super().__init__(vars(cls))
        self.cls = cls

    def __getitem__(self, key: str) -> Any:
        return vars(self.cls)[key]

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self.cls, key, value)


def _class_dict(cls: type) -> dict[str, Any]:
    return _ClassNamespace(cls)


def _in_packages(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def resolve(module: ModuleType, path: tuple[str, ...]) -> Any:
    value: Any = module
    for part in path:
        value = getattr(value, part)
    return value


def rebind(old: ModuleType, new: ModuleType, references: tuple[Reference, ...]) -> None:
    """Point every reference found in the parent at ``new``'s counterpart, all or none (each checked first)."""
    owned = _owned(old)
    replacements = []
    for reference in references:
        if _path_of(reference.container[reference.key], owned) != reference.path:
            raise ImportError(f"{reference.where} no longer holds {old.__name__}.{'.'.join(reference.path)}")
        replacements.append((reference, resolve(new, reference.path)))
    for reference, value in replacements:
        reference.container[reference.key] = value


def clear_caches(packages: Iterable[str], exclude: Callable[[str], bool] = lambda name: False) -> int:
    """Empty every ``functools.lru_cache`` at module level in ``packages``: cached results may hold old objects."""
    prefixes = tuple(packages)
    cleared = 0
    for name, loaded in list(sys.modules.items()):
        if loaded is None or not _in_packages(name, prefixes) or exclude(name):
            continue
        for value in list(vars(loaded).values()):
            if isinstance(value, functools._lru_cache_wrapper):  # not getattr: lazy module proxies raise
                value.cache_clear()
                cleared += 1
    return cleared
