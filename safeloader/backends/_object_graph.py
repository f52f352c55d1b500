"""Where a Dataset holds objects of a kind: the walk over its object graph that the backends which
reopen a library's handles in each worker share (lmdb's environments, blosc2's chunks, PyAV's
containers)."""

from __future__ import annotations

from types import FunctionType, ModuleType
from typing import Any

__all__ = ["find_instances"]

_MAX_CONTAINER = 10_000  # longer lists/dicts (file lists, index tables) are not searched
_MAX_NODES = 100_000
_LEAVES = (str, bytes, int, float, type, ModuleType, FunctionType)  # never searched inside


def find_instances(root: Any, kind: type | tuple[type, ...]) -> list[tuple[Any, Any, Any]]:
    """(holder, key, object) for each instance of ``kind`` reachable from ``root`` through
    instance attributes, lists, dicts and tuples (``holder[key]`` or ``holder.key``)."""
    found = []
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) < _MAX_NODES:
        node = stack.pop()
        if id(node) in seen or node is None or isinstance(node, _LEAVES):
            continue
        seen.add(id(node))
        if isinstance(node, (list, dict)):
            if len(node) > _MAX_CONTAINER:
                continue
            items = node.items() if isinstance(node, dict) else enumerate(node)
        elif isinstance(node, tuple):
            stack.extend(node[:_MAX_CONTAINER])
            continue
        else:
            attributes = getattr(node, "__dict__", None)
            if not isinstance(attributes, dict):
                continue
            items = attributes.items()
        for key, value in list(items):
            if isinstance(value, kind):
                found.append((node, key, value))
            else:
                stack.append(value)
    return found
