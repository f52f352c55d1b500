"""PyAV: the containers a Dataset opened in the parent decode in forked workers (why: docs/internals.md)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._context import ForkContext
from ._backend import Backend
from ._object_graph import find_instances
from .files import NAME as FILES

NAME = "pyav"

__all__ = ["BACKEND", "NAME"]


@dataclass(frozen=True)
class _Reopen:
    """How a worker opens its copy of one input container."""

    container: Any
    """The parent's."""
    file: Any
    """Its path (or URL), or the file object it reads."""
    keywords: dict[str, Any]
    """``av.open``'s other arguments, as the parent's were."""
    streams: tuple[tuple[int, Any, int, dict[str, str]], ...]
    """(index, thread_type, thread_count, codec options) of each stream."""


@dataclass(frozen=True)
class _Plan:
    """A loader's, made at its start: what its forked workers reopen and where they put it."""

    reopens: tuple[_Reopen, ...]
    places: tuple[tuple[Any, Any, Any, Any, int | None, bool], ...]
    """(holder, key, the parent's object held there, its container, its stream's index (None for the
    container itself), whether it is that stream's codec context)."""


def make_plan(root: Any) -> _Plan | None:
    """What a worker reopens for the Dataset ``root``: every open input container it holds (directly,
    or through a stream or codec context of it), or None when it holds none."""
    from av.codec.context import CodecContext
    from av.container import InputContainer
    from av.stream import Stream

    found = find_instances(root, (InputContainer, Stream, CodecContext))
    containers: dict[int, Any] = {}
    for _holder, _key, obj in found:
        container = obj if isinstance(obj, InputContainer) else getattr(obj, "container", None)
        if isinstance(container, InputContainer):
            containers[id(container)] = container
    contexts = {
        id(stream.codec_context): (container, stream.index)
        for container in containers.values()
        for stream in container.streams
        if stream.codec_context is not None
    }
    places = []
    for holder, key, obj in found:
        if isinstance(obj, CodecContext):  # one of no container found is not reopened
            container, index = contexts.get(id(obj), (None, None))
        elif isinstance(obj, InputContainer):
            container, index = obj, None
        else:
            container, index = getattr(obj, "container", None), obj.index
        if isinstance(container, InputContainer) and _is_open(container):
            places.append((holder, key, obj, container, index, isinstance(obj, CodecContext)))
    reopens = tuple(_reopen_of(container) for container in containers.values() if _is_open(container))
    return _Plan(reopens, tuple(places)) if reopens else None


def _is_open(container: Any) -> bool:
    try:
        container.duration  # noqa: B018  (a closed container raises AssertionError)
    except Exception:
        return False
    return True


# av.open's keywords that an open container keeps under the same name, and how to copy each.
_READ_BACK: dict[str, Callable[[Any], Any]] = {
    "options": dict,
    "container_options": dict,
    "stream_options": lambda options: [dict(one) for one in options],
    "metadata_encoding": lambda value: value,
    "metadata_errors": lambda value: value,
    "io_open": lambda value: value,
}


def _reopen_of(container: Any) -> _Reopen:
    # A container reading a file object holds it in a PyIOFile (``.file``).
    file = container.file.file if container.file is not None else container.name
    keywords: dict[str, Any] = {
        "mode": "r",
        # The demuxer the parent's probe found (its first name: "mov" of "mov,mp4,m4a,3gp,3g2,mj2").
        "format": container.format.name.split(",")[0],
        "timeout": (container.open_timeout, container.read_timeout),
    }  # not readable, so not kept: buffer_size (the default is used) and hwaccel
    for keyword, copy in _READ_BACK.items():  # each where this PyAV keeps it (19 dropped some)
        if hasattr(container, keyword):
            keywords[keyword] = copy(getattr(container, keyword))
    streams = tuple(
        (
            stream.index,
            stream.codec_context.thread_type,
            stream.codec_context.thread_count,
            dict(stream.codec_context.options),
        )
        for stream in container.streams
        if stream.codec_context is not None
    )
    return _Reopen(container, file, keywords, streams)


def _open(reopen: _Reopen, av: Any) -> Any:
    file = reopen.file
    if not isinstance(file, str) and hasattr(file, "seek"):
        file.seek(0)  # the worker's copy of a file object (its own descriptor: the "files" backend)
    container = av.open(file, **reopen.keywords)
    for index, thread_type, thread_count, options in reopen.streams:
        codec_context = container.streams[index].codec_context
        codec_context.thread_type = thread_type
        codec_context.thread_count = thread_count
        if options:
            codec_context.options = dict(options)
    return container


class PyavBackend(Backend):
    name = NAME
    description = "each worker opens its own copy of the PyAV input containers the Dataset holds (threaded decoders)"
    plan_per_start = True
    # Reopens once "files" gave the worker its own descriptors (a container reading a file object).
    first = True
    runs_after = (FILES,)
    requires = ("av",)
    libraries = ("av",)  # PyAV's FFmpeg (av.libs), not FFmpeg libraries other packages ship

    def __init__(self) -> None:
        self._inherited: list[Any] = []  # in a worker: the parent's objects, never freed there

    def before(self, ctx: ForkContext) -> _Plan | None:
        # Once per loader start (plan_per_start): the containers its Dataset holds.
        loader = ctx.loader if ctx is not None else None
        return make_plan(getattr(loader, "dataset", None)) if loader is not None else None

    def uncovered(self, loader: Any) -> str:
        # FFmpeg's threads belong to a codec context; those of a container the Dataset does not
        # hold (a module global, a closure) are not reopened, and a worker using it waits forever.
        if make_plan(getattr(loader, "dataset", None)) is not None:
            return ""  # not exact: a second container elsewhere would be missed (docs/backends.md)
        return (
            "its backend 'pyav' reopens only the input containers the Dataset holds, and this Dataset holds "
            "none: the threads decode for a container held elsewhere (a module global?)"
        )

    def after_in_child(self, ctx: ForkContext, plan: _Plan | None) -> None:
        self._new_reformatters()
        if plan is None:
            return
        import av

        self._inherited.extend(reopen.container for reopen in plan.reopens)
        fresh = {id(reopen.container): _open(reopen, av) for reopen in plan.reopens}
        for holder, key, obj, container, index, is_codec_context in plan.places:
            self._inherited.append(obj)
            replacement = fresh[id(container)]
            if index is not None:
                replacement = replacement.streams[index]
                if is_codec_context:
                    replacement = replacement.codec_context
            if isinstance(holder, (list, dict)):
                holder[key] = replacement
            else:
                holder.__dict__[key] = replacement


    def _new_reformatters(self) -> None:
        """PyAV 19+ keeps one swscale context per thread (``av.video.frame._thread_local``), whose
        scaling threads the parent started: the worker's threads get new ones on first use. The
        inherited one is kept, never freed (freeing it joins threads this process does not have)."""
        frame = sys.modules.get("av.video.frame")
        local = getattr(frame, "_thread_local", None)
        if local is not None and getattr(local, "reformatter", None) is not None:
            self._inherited.append(local)
            frame._thread_local = threading.local()  # type: ignore[union-attr]


BACKEND = PyavBackend()
