"""In a worker: polars objects built before the fork move to the worker's own polars runtime
(why: docs/internals.md)."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..errors import PolarsInheritedObjectError

PACKAGE = "polars"

__all__ = ["Slot", "PolarsInheritedObjectError", "find_slots", "install"]


@dataclass(frozen=True)
class Slot:
    """A polars class attribute annotated with one of the extension's native types."""

    cls: type
    attribute: str
    type_name: str


def find_slots(native: ModuleType) -> tuple[Slot, ...]:
    """In the parent: every attribute of polars' classes annotated with a type of ``native``."""
    types = {name for name, value in vars(native).items() if isinstance(value, type)}
    slots = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        for value in list(vars(module).values()):
            if not isinstance(value, type) or value.__module__ != name:
                continue
            for attribute, annotation in vars(value).get("__annotations__", {}).items():
                text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
                type_name = text.rsplit(".", 1)[-1].strip()
                if type_name in types:
                    slots.append(Slot(value, attribute, type_name))
        # Unannotated attributes of polars objects built at import (QueryOptFlags' defaults, say).
        for value in list(vars(module).values()):
            cls = type(value)
            if not (cls.__module__ or "").startswith(PACKAGE) or not hasattr(value, "__dict__"):
                continue
            for attribute, held in list(vars(value).items()):
                held_type = type(held)
                if getattr(native, held_type.__name__, None) is held_type:
                    slots.append(Slot(cls, attribute, held_type.__name__))
    return tuple(dict.fromkeys(slots))


_MISSING = object()


class _Inherited:
    """Data descriptor standing in for a class attribute: moves an inherited native object on first use."""

    def __init__(self, slot: Slot, old_type: type, convert: Callable[[Any, str], Any], default: Any) -> None:
        self.attribute = slot.attribute
        self.old_type = old_type
        self.convert = convert
        self.default = default
        self.what = f"{slot.cls.__module__}.{slot.cls.__qualname__}.{slot.attribute} ({slot.type_name})"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self if self.default is _MISSING else self.default
        namespace = instance.__dict__
        value = namespace.get(self.attribute, _MISSING)
        if value is _MISSING:
            if self.default is _MISSING:
                raise AttributeError(self.attribute)
            return self.default
        if type(value) is self.old_type:
            value = self.convert(value, self.what)
            namespace[self.attribute] = value
        return value

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[self.attribute] = value


def install(old: ModuleType, new: ModuleType, slots: tuple[Slot, ...]) -> None:
    """In the worker, after the new module is bound: put a descriptor on every slot."""
    converters = _converters(new)
    for slot in slots:
        old_type = getattr(old, slot.type_name, None)
        if not isinstance(old_type, type):
            continue
        default = vars(slot.cls).get(slot.attribute, _MISSING)
        if isinstance(default, _Inherited):  # installed by an earlier fork of this process's ancestors
            default = default.default
        convert = converters.get(slot.type_name, _refuse)
        setattr(slot.cls, slot.attribute, _Inherited(slot, old_type, convert, default))


def _fix() -> str:
    return (
        "Build it in the worker (in __getitem__, or once per worker in worker_init_fn), or keep a DataFrame "
        "(which moves) in __init__ and derive the rest from it in the worker; or start workers with "
        "multiprocessing_context='forkserver'."
    )


def _refuse(value: Any, what: str) -> Any:
    raise PolarsInheritedObjectError(
        f"safeloader: a polars object built before the DataLoader forked its workers cannot be used in a "
        f"worker: {what}. It belongs to the parent's polars runtime, whose thread pool does not exist in a "
        f"forked worker (using it would hang). {_fix()}"
    )


def _converters(new: ModuleType) -> dict[str, Callable[[Any, str], Any]]:
    def series(old: Any, what: str) -> Any:
        try:
            return new.PySeries.from_arrow_c_stream(old)
        except Exception as exc:  # e.g. Object columns: no Arrow representation
            raise PolarsInheritedObjectError(
                f"safeloader: could not move a polars Series built before the fork into this worker's polars "
                f"runtime ({what}, dtype {old.dtype()!r}): {type(exc).__name__}: {exc}. {_fix()}"
            ) from exc

    def frame(old: Any, what: str) -> Any:
        return new.PyDataFrame([series(column, what) for column in old.get_columns()])

    def expression(old: Any, what: str) -> Any:
        fresh = sys.modules[PACKAGE].lit(0)._pyexpr  # polars' own way to make one (Expr.__setstate__)
        fresh.__setstate__(old.__getstate__())
        return fresh

    def lazy(old: Any, what: str) -> Any:
        plan = old.describe_plan()
        if "DF [" in plan:
            raise PolarsInheritedObjectError(
                f"safeloader: a polars LazyFrame built before the fork on an in-memory DataFrame cannot be used "
                f"in a worker ({what}): moving its data would run on the parent's thread pool, which does not "
                f"exist in a forked worker. Keep the DataFrame in __init__ and call .lazy() in the worker. "
                f"{_fix()}"
            )
        buffer = io.BytesIO()
        old.serialize_binary(buffer)
        buffer.seek(0)
        return new.PyLazyFrame.deserialize_binary(buffer)

    def categories(old: Any, what: str) -> Any:
        if old.is_global():
            return new.PyCategories.global_categories()
        return new.PyCategories(old.name(), old.namespace(), old.physical())

    def flags(old: Any, what: str) -> Any:
        fresh = new.PyOptFlags.default()
        for name, member in vars(type(old)).items():
            if type(member).__name__ == "getset_descriptor":
                try:
                    setattr(fresh, name, getattr(old, name))
                except (AttributeError, TypeError):  # read-only
                    pass
        return fresh

    return {
        "PyOptFlags": flags,
        "PySeries": series,
        "PyDataFrame": frame,
        "PyExpr": expression,
        "PyLazyFrame": lazy,
        "PyCategories": categories,
    }

