"""The files a loader's workers can reach: the descriptors its Dataset, sampler, collate_fn and
worker_init_fn hold, found once per start by a bounded walk of those objects.

How it works and why: docs/internals.md, ``safeloader.backends._held_files``.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import stat
import sys
from collections import deque
from collections.abc import Iterator
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

from .. import native

EVERY_FILE = "every read-only file"
"""What ``held_descriptors`` answers where an object holds a file it cannot locate (an HDF5 file
on a Python file object, a loader with no objects to walk): privatize them all, as before."""

_MAX_NODES = 20_000  # objects visited per start, nearest first: beyond, the rest is not searched
# Longer lists, dicts and sets are looked at through a strided sample of this many items: all
# plain values (an index table) and they are not searched; else they are searched by kind.
_MAX_CONTAINER = 10_000
# A container of more items is searched by kind: the first _PROBE items of each type are searched
# (within _PROBE_NODES objects), and the others of that type only if those held a file. Large
# collections are homogeneous (annotation records, shard readers): 9,000 records of a dict and a
# list each cost ~20,000 visits searched whole, and a few dozen this way.
_LARGE = 32
_PROBE = 4
_PROBE_NODES = 2_000
# Never searched inside, and never queued (checked by exact type, the cheapest test): values that
# hold no file. Ints are looked at where an attribute holds them, as possible descriptors.
_LEAF_TYPES = frozenset({str, bytes, bytearray, int, float, complex, bool, type(None), range})
_NOT_SEARCHED = (type, ModuleType, BuiltinFunctionType)
_CONTAINERS = (list, tuple, set, frozenset, deque)
# io's own file classes (exact types): thousands of shards a Dataset holds are each looked at cheaply.
_IO_CLASSES = frozenset({io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper})
_slot_names: dict[type, tuple[str, ...]] = {}
# Extension types that hold a Python file object in an attribute of their own (no __dict__): by
# top-level package, the attributes to follow. PyAV: a container's PyIOFile (``.file``), its file (``.file``).
_NATIVE_HOLDERS = {"av": ("file",)}


def roots(loader: Any) -> list[Any]:
    """What a worker of ``loader`` is handed: its Dataset, samplers, collate_fn and worker_init_fn,
    the methods of their own classes, and the module globals those functions name (one level: the
    training script's ``DATA = np.load(...)`` that ``__getitem__`` reads)."""
    init = getattr(loader, "worker_init_fn", None)
    # safeloader's own WorkerInit wraps the user's function (duck-typed: _loader is a higher layer).
    init = getattr(init, "user_fn", init)
    names = ("dataset", "sampler", "batch_sampler", "collate_fn")
    handed = [getattr(loader, name, None) for name in names] + [init]
    functions = [method for obj in handed for method in _own_methods(type(obj))]
    functions += [obj for obj in handed if isinstance(obj, FunctionType) and not _in_torch(obj.__module__)]
    return handed + functions + [value for function in functions for value in _named_globals(function)]


def _in_torch(module: str | None) -> bool:
    return (module or "").partition(".")[0] == "torch"


def _own_methods(cls: type) -> list[FunctionType]:
    """The functions defined by ``cls`` and its bases outside torch and the standard types: the
    Dataset's ``__getitem__`` and its helpers; not its constructor, which ran in the parent."""
    found = []
    for klass in cls.__mro__:
        if klass.__module__ == "builtins" or _in_torch(klass.__module__):
            continue
        for name, value in vars(klass).items():
            if name in ("__init__", "__new__"):
                continue
            function = getattr(value, "__func__", value)  # staticmethod, classmethod
            if isinstance(function, FunctionType):
                found.append(function)
    return found


def _named_globals(function: FunctionType) -> list[Any]:
    """The module globals ``function``'s code names (``DATA = np.load(...)`` at the top of the
    training script, read in ``__getitem__``): a worker reaches them as the Dataset's own."""
    names: set[str] = set()
    codes = [function.__code__]
    while codes:  # with the code of the functions and comprehensions defined inside it
        code = codes.pop()
        names.update(code.co_names)
        codes += [const for const in code.co_consts if isinstance(const, type(code))]
    module_globals = function.__globals__
    return [module_globals[name] for name in names if name in module_globals]


def held_descriptors(loader: Any, names: dict[int, bytes] | None = None) -> frozenset[int] | str:
    """The descriptors of regular files ``loader``'s objects hold (file objects, raw descriptor
    numbers in attributes, HDF5 files, anything built on them), or ``EVERY_FILE``. ``names``, if
    given, gets the path a file object names for its descriptor (the one found first)."""
    if loader is None:
        return EVERY_FILE
    fds: set[int] = set()
    numbers: set[int] = set()
    identities: set[tuple[int, int]] = set()
    h5py_files: set[int] = set()
    h5py = sys.modules.get("h5py")
    hl_object = getattr(getattr(h5py, "_hl", None), "base", None)
    hl_object = getattr(hl_object, "HLObject", None)
    visits = _Visits(_MAX_NODES)
    for node in _walk(roots(loader), numbers, _MAX_NODES, hl_object, visits):
        # By type: an isinstance against an ABC (io.IOBase) asks the object for its __class__, which
        # some objects refuse (numpy's NpzFile.f raises AttributeError for any name it lacks).
        cls = type(node)
        if cls in _IO_CLASSES or issubclass(cls, io.IOBase):  # the set first: thousands of shards, each
            _add_file(node, fds, names)
        elif hl_object is not None and issubclass(cls, hl_object):
            if not _h5py_file(node, h5py, fds, identities, h5py_files):
                return EVERY_FILE
    if visits.cut:  # what the search did not reach may hold files: every one is made private, as before
        return EVERY_FILE
    _add_files(visits.files, fds, names)  # the shards of large containers, taken without the walk
    # A number the Dataset holds may be a raw descriptor (os.open): kept if it names a regular file.
    fds.update(fd for fd in numbers if 0 <= fd < _descriptor_limit() and _is_regular_file(fd))
    if identities:  # files known by path only (HDF5 on the stdio driver): their descriptors, by inode
        fds.update(fd for fd, mode, dev, ino in native.descriptor_table()
                   if stat.S_ISREG(mode) and (dev, ino) in identities)
    return frozenset(fds)


def _add_file(f: Any, fds: set[int], names: dict[int, bytes] | None) -> None:
    fd = _fileno(f)
    if fd is not None:
        fds.add(fd)
        if names is not None and fd not in names:
            _add_name(f, fd, names)


def _add_files(files: list[Any], fds: set[int], names: dict[int, bytes] | None) -> None:
    """``_add_file`` of each of ``files`` (io's own classes), inline: a Dataset may hold thousands."""
    encoding, errors = _FS_ENCODING, _FS_ERRORS
    for f in files:
        try:
            if f.closed:
                continue
            fd = f.fileno()
            name = f.name if names is not None and fd not in names else None
        except Exception:  # a file object that refuses (closed meanwhile, a raw fd without a name)
            _add_file(f, fds, names)
            continue
        fds.add(fd)
        if type(name) is str and name:
            path = name.encode(encoding, errors)
            if b"\0" not in path:
                names[fd] = path  # type: ignore[index]
        elif name is not None:
            _add_name(f, fd, names)  # type: ignore[arg-type]


class _Visits:
    """What is left of one search's budget of objects, shared by its probes of large containers,
    whether the search stopped before it had looked at everything it could reach, and the file
    objects of io's own classes found in large containers (``files``: taken as they are, each
    a leaf, outside the budget)."""

    __slots__ = ("cut", "files", "left")

    def __init__(self, left: int) -> None:
        self.left = left
        self.cut = False
        self.files: list[Any] = []


def _walk(
    start: Any, numbers: set[int], limit: int, hl_object: type | None, visits: _Visits, probing: bool = False
) -> Iterator[Any]:
    """Each object reachable from ``start`` through instance attributes (``__dict__`` and slots),
    containers (large ones by kind), closures, partials and bound methods, nearest first, at most
    ``limit`` and never beyond what ``visits`` has left; the ints that attributes hold go to
    ``numbers``."""
    seen: set[int] = set()
    queue = deque(node for node in start if type(node) not in _LEAF_TYPES)
    while queue and len(seen) < limit and visits.left > 0:
        node = queue.popleft()
        # type(): isinstance reads __class__, which a proxy (wrapt, a lazy object) answers with code.
        if id(node) in seen or issubclass(type(node), _NOT_SEARCHED):
            continue
        seen.add(id(node))
        visits.left -= 1
        yield node
        if type(node) in _IO_CLASSES and _names_only(node):  # the common leaf, without _held_by's call
            continue
        try:
            values = _held_by(node, numbers, hl_object, visits, probing)
            queue.extend(value for value in values if type(value) not in _LEAF_TYPES)
        except Exception:  # a container or attribute that raises (a user's __len__, __getattr__): not searched
            continue
    if queue and not probing:
        visits.cut = True


def _held_by(node: Any, numbers: set[int], hl_object: type | None, visits: _Visits, probing: bool) -> Any:
    """What ``node`` holds, to search next."""
    if type(node) in _IO_CLASSES and _names_only(node):
        return ()
    if isinstance(node, (dict, *_CONTAINERS)):
        items = node.values() if isinstance(node, dict) else node
        if len(node) > _MAX_CONTAINER and _plain_values(items, len(node)):
            return ()
        if len(node) > _LARGE:
            # A probe looks at small containers only: probes within probes multiplied (an s3fs
            # client's object graph took minutes), and their visits count against the search's.
            return () if probing else _by_kind(items, hl_object, visits, numbers)
        return items
    if isinstance(node, FunctionType):
        cells = [cell.cell_contents for cell in node.__closure__ or () if _filled(cell)]
        return cells + list(node.__defaults__ or ())
    if isinstance(node, MethodType):
        return (node.__self__, node.__func__)
    return _attributes(node, numbers)


def _names_only(f: Any) -> bool:
    """Whether a file object of io's own classes holds nothing to search: its state is in C, and
    its attributes are its name and mode (strings), unless the program set others."""
    attributes = getattr(f, "__dict__", None)
    return not attributes or all(type(value) is str for value in attributes.values())


def _plain_values(items: Any, size: int) -> bool:
    """Whether a strided sample of a very large container's items holds plain values only."""
    step = max(1, size // _MAX_CONTAINER)
    return all(type(item) in _LEAF_TYPES for item in itertools.islice(items, 0, None, step))


def _by_kind(items: Any, hl_object: type | None, visits: _Visits, numbers: set[int]) -> list[Any]:
    """The items of a large container worth searching: of each type, all of them if the first
    ``_PROBE`` hold a file (or are one, or hold a raw descriptor number), else none."""
    kinds: dict[type, list[Any]] = {}
    for item in items:
        cls = type(item)
        if cls not in _LEAF_TYPES:
            kinds.setdefault(cls, []).append(item)
    found = []
    for cls, kind in kinds.items():
        if cls in _IO_CLASSES:  # thousands of shards: no walk, unless the program hung objects on some
            visits.files += kind
            found += [f for f in kind if not _names_only(f)]
            continue
        probe_numbers: set[int] = set()
        probe = _walk(kind[:_PROBE], probe_numbers, _PROBE_NODES, hl_object, visits, probing=True)
        limit = _descriptor_limit()
        if any(_holds_a_file(node, hl_object) for node in probe) or any(
            0 <= number < limit and _is_regular_file(number) for number in probe_numbers
        ):
            found += kind
    return found


def _holds_a_file(node: Any, hl_object: type | None) -> bool:
    cls = type(node)
    return issubclass(cls, io.IOBase) or (hl_object is not None and issubclass(cls, hl_object))


def _attributes(node: Any, numbers: set[int]) -> list[Any]:
    """What an object holds in its attributes (ints go to ``numbers``), its partial's arguments,
    and the file objects an extension type of ``_NATIVE_HOLDERS`` keeps."""
    cls = type(node)
    found: list[Any] = []
    if isinstance(node, functools.partial):
        found += [node.func, *node.args, *node.keywords.values()]
    attributes = getattr(node, "__dict__", None)
    if isinstance(attributes, dict):
        found += attributes.values()
    found += [getattr(node, name, None) for name in _slots(cls)]
    found += [getattr(node, name, None) for name in _NATIVE_HOLDERS.get(cls.__module__.partition(".")[0], ())]
    numbers.update(value for value in found if type(value) is int)
    return found


def _filled(cell: Any) -> bool:
    try:
        return cell.cell_contents is not cell  # reading it is the test
    except ValueError:  # a closure variable not yet assigned
        return False


def _slots(cls: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``cls`` and its bases (cached per class)."""
    names = _slot_names.get(cls)
    if names is None:
        found: list[str] = []
        for klass in cls.__mro__:
            slots = vars(klass).get("__slots__", ())
            found.extend([slots] if isinstance(slots, str) else slots)
        names = _slot_names[cls] = tuple(name for name in found if name not in ("__dict__", "__weakref__"))
    return names


def _fileno(f: io.IOBase) -> int | None:
    try:
        return None if f.closed else f.fileno()
    except Exception:  # in-memory or remote file objects (BytesIO, fsspec): no descriptor
        return None


def _add_name(f: io.IOBase, fd: int, names: dict[int, bytes]) -> None:
    """The path ``f`` was opened by (``name``: a file object opened by descriptor has an int there)."""
    try:
        name = f.name  # type: ignore[attr-defined]
    except Exception:  # none, or a property that raises
        return
    if isinstance(name, (str, bytes)) and name:
        # os.fsencode's own encoding, without its Python-level call (a Dataset may hold thousands).
        path = name.encode(_FS_ENCODING, _FS_ERRORS) if isinstance(name, str) else name
        if b"\0" not in path:
            names[fd] = path


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def _is_regular_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _descriptor_limit() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _h5py_file(obj: Any, h5py: Any, fds: set[int], identities: set[tuple[int, int]], done: set[int]) -> bool:
    """Add the descriptor (or identity) of the HDF5 file behind ``obj`` (a File, Group or Dataset);
    False where it reads through a Python file object safeloader cannot locate."""
    from h5py import h5f, h5fd, h5i

    try:
        with h5py._objects.phil:
            fid = h5i.get_file_id(obj.id)
            if fid.fileno in done:
                return True
            done.add(fid.fileno)
            driver = fid.get_access_plist().get_driver()
            if driver in (h5fd.SEC2, getattr(h5fd, "DIRECT", h5fd.SEC2)):
                fds.add(fid.get_vfd_handle())
                return True
            if driver == h5fd.fileobj_driver:
                return False
            name = os.fsdecode(h5f.get_name(fid))
    except (ValueError, RuntimeError, TypeError, AttributeError):  # closed, or an unknown driver
        return True
    try:
        found = os.stat(name)
    except OSError:  # moved or deleted since: cannot be matched
        return False
    identities.add((found.st_dev, found.st_ino))
    return True
