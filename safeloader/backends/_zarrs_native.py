"""A private copy of zarrs' native extension for each forked worker (why: docs/internals.md)."""

from __future__ import annotations

import os
import sys
from types import ModuleType

from . import _extension_copy
from ._extension_copy import copy_into

INTERNAL = "zarrs._internal"


def make_copy(source: str) -> int:
    """A close-on-exec memfd holding the bytes of ``source``; the caller owns it."""
    fd = os.memfd_create("safeloader-zarrs-internal", os.MFD_CLOEXEC)
    try:
        copy_into(fd, source)
    except BaseException:
        os.close(fd)
        raise
    return fd


def load_copy(fd: int) -> ModuleType:
    """Load the extension in memfd ``fd`` as a new ``zarrs._internal`` (not yet installed)."""
    return _extension_copy.load_copy(INTERNAL, fd)


Binding = tuple[str, str, str]  # (module, attribute, name in zarrs._internal)


def find_bindings(internal: ModuleType) -> tuple[Binding, ...]:
    """Every ``zarrs.*`` global bound to an object of ``internal``. Run in the parent, once:
    in a fresh fork, walking every module would touch (and copy) a page per module."""
    exported = {id(value): name for name, value in vars(internal).items() if not name.startswith("__")}
    found = []
    for module_name, module in list(sys.modules.items()):
        if module is None or module is internal or not (module_name == "zarrs" or module_name.startswith("zarrs.")):
            continue
        for attribute, value in vars(module).items():
            name = exported.get(id(value))
            if name is not None and getattr(internal, name) is value:
                found.append((module_name, attribute, name))
    return tuple(found)


def install_copy(old: ModuleType, new: ModuleType, bindings: tuple[Binding, ...]) -> None:
    """Point ``bindings`` (found in the parent) and ``sys.modules`` at ``new``; every binding must move
    (mixing the two modules fails), and one no longer holding ``old``'s object means the layout changed."""
    for module_name, attribute, name in bindings:
        module = sys.modules[module_name]
        if getattr(module, attribute, None) is not getattr(old, name):
            raise ImportError(
                f"{module_name}.{attribute} must be zarrs._internal.{name}, got {getattr(module, attribute)!r}"
            )
    for module_name, attribute, name in bindings:
        setattr(sys.modules[module_name], attribute, getattr(new, name))
    sys.modules[INTERNAL] = new
    package = sys.modules.get("zarrs")
    if package is not None:
        package._internal = new  # type: ignore[attr-defined]
