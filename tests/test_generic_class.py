"""SafeDataLoader is generic like torch's DataLoader: everything torch's class supports at class level works.

After ``install()`` ``torch.utils.data.DataLoader`` *is* SafeDataLoader, so any
code that subscripts or subclasses ``DataLoader[T]`` at run time (torchdata's
``class StatefulDataLoader(DataLoader[_T_co])``) goes through it.
"""

from __future__ import annotations

import pickle
import typing

import pytest
import torch
import torch.utils.data
from torch.utils.data import DataLoader as TorchDataLoader

import safeloader
from safeloader import SafeDataLoader

T = typing.TypeVar("T")


class IntLoader(SafeDataLoader[int]):
    """A module-level subclass with a type argument (picklable by name)."""


class Tagged(SafeDataLoader[T]):
    def __init_subclass__(cls, tag: str = "none", **kwargs: typing.Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.tag = tag


class TaggedInts(Tagged[int], tag="ints"):
    pass


def test_a_subclass_without_type_parameter_is_not_generic_the_failure_fixed():
    # What SafeDataLoader was (``class SafeDataLoader(DataLoader)``): subscripting raises.
    class NotGeneric(TorchDataLoader):
        pass

    with pytest.raises(TypeError, match="is not a generic class"):
        NotGeneric[int]


def test_subscripting_works_like_torchs_class():
    alias = safeloader.DataLoader[int]
    assert typing.get_origin(alias) is SafeDataLoader
    assert typing.get_args(alias) == (int,)
    assert len(SafeDataLoader.__parameters__) == len(TorchDataLoader.__parameters__) == 1
    assert repr(alias) == "safeloader._loader.SafeDataLoader[int]"
    assert repr(SafeDataLoader) == "<class 'safeloader._loader.SafeDataLoader'>"
    loader = alias([1, 2, 3], batch_size=None)  # calling the alias builds a SafeDataLoader
    assert type(loader) is SafeDataLoader and [int(x) for x in loader] == [1, 2, 3]


def test_subclass_with_a_type_parameter_and_init_subclass():
    assert IntLoader.__orig_bases__ == (SafeDataLoader[int],)
    assert issubclass(IntLoader, TorchDataLoader) and IntLoader.__parameters__ == ()
    assert TaggedInts.tag == "ints" and Tagged.__parameters__ == (T,)
    loader = TaggedInts(list(range(6)), batch_size=2, num_workers=2, timeout=30)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5]]


def test_classes_aliases_and_instances_pickle():
    assert pickle.loads(pickle.dumps(SafeDataLoader[int])) == SafeDataLoader[int]
    assert pickle.loads(pickle.dumps(IntLoader)) is IntLoader
    loader = IntLoader(list(range(4)), batch_size=2, zarrs_mode="serial")
    copy = pickle.loads(pickle.dumps(loader))
    assert type(copy) is IntLoader and copy.zarrs_mode == "serial"
    assert [batch.tolist() for batch in copy] == [[0, 1], [2, 3]]


def test_annotations_evaluated_at_run_time_after_install(clean_registry):
    with safeloader.install():
        assert torch.utils.data.DataLoader is SafeDataLoader

        def batches(loader: torch.utils.data.DataLoader[int]) -> list[int]:
            return list(loader)

        hints = typing.get_type_hints(batches)
        assert hints["loader"] == SafeDataLoader[int]

        class Subclassed(torch.utils.data.DataLoader[int]):  # as torchdata does at import
            pass

    assert issubclass(Subclassed, SafeDataLoader)
    assert isinstance(Subclassed([1]), TorchDataLoader)
