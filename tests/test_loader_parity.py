"""SafeDataLoader returns what torch's DataLoader returns, and fails as torch fails."""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, Sampler, get_worker_info
from torch.utils.data import DataLoader as TorchDataLoader

import safeloader
from safeloader import DataLoader

pytestmark = pytest.mark.timeout(90)


class Squares(Dataset):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, index: int):
        return {"x": torch.tensor([index, index * index]), "i": index}


class RandomPerItem(Dataset):
    """Uses the worker's RNG: equal output proves workers are seeded as torch seeds them."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return torch.rand(2)


class Counting(IterableDataset):
    """Splits range(30) between workers, as torch's docs recommend."""

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(worker, 30, workers))


class FlakyIterator:
    """Raises ValueError for every item i with i % 5 == 3, and goes on at the next ``next()``."""

    def __init__(self, items: range) -> None:
        self.items = iter(items)

    def __iter__(self):
        return self

    def __next__(self) -> int:
        item = next(self.items)
        if item % 5 == 3:
            raise ValueError(f"item {item}")
        return item


class Flaky(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return FlakyIterator(range(worker, 20, workers))


class EveryThird(Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 3))

    def __len__(self) -> int:
        return len(range(0, self.n, 3))


def as_lists(batches):
    def convert(value):
        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        return value

    return [convert(b) for b in batches]


def pair_collate(items):
    return ("custom", [item["i"] for item in items])


CASES = {
    "map-style": dict(batch_size=4),
    "shuffle-seeded": dict(batch_size=5, shuffle=True, generator_seed=7),
    "custom-sampler": dict(batch_size=2, sampler=EveryThird(23)),
    "batch-sampler": dict(batch_sampler=BatchSampler(EveryThird(23), 3, drop_last=False)),
    "drop-last": dict(batch_size=4, drop_last=True),
    "collate-fn": dict(batch_size=3, collate_fn=pair_collate),
    "no-batching": dict(batch_size=None),
}


def build(cls, dataset, num_workers, case):
    kwargs = dict(CASES[case])
    seed = kwargs.pop("generator_seed", None)
    if seed is not None:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    return cls(dataset, num_workers=num_workers, **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_batches_equal_torch_without_workers(case):
    expected = as_lists(build(TorchDataLoader, Squares(), 0, case))
    got = as_lists(build(DataLoader, Squares(), 2, case))
    assert got == expected


def test_persistent_workers_over_three_epochs_equal_torch():
    # With workers, torch draws a base seed from the generator once per
    # iterator, so persistent workers shuffle like torch's persistent loader;
    # each epoch holds the very batches of the loader without workers.
    def make(cls, **kwargs):
        return cls(Squares(), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(7), **kwargs)

    torch_persistent = make(TorchDataLoader, num_workers=2, persistent_workers=True)
    ours = make(DataLoader, num_workers=2, persistent_workers=True)
    single = as_lists(make(TorchDataLoader))
    for _ in range(3):
        epoch = as_lists(ours)
        assert epoch == as_lists(torch_persistent)
        assert sorted(i for batch in epoch for i in batch["i"]) == sorted(i for b in single for i in b["i"])
    del ours, torch_persistent


def test_iterable_dataset_equals_torch():
    single = [x for batch in TorchDataLoader(Counting(), batch_size=4) for x in batch.tolist()]
    ours = as_lists(DataLoader(Counting(), batch_size=4, num_workers=3))
    torch_workers = as_lists(TorchDataLoader(Counting(), batch_size=4, num_workers=3))
    assert ours == torch_workers  # same interleaving as torch with the same workers
    assert sorted(x for batch in ours for x in batch) == sorted(single)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_an_iterable_datasets_iterator_that_raises_goes_on_after_the_error_as_under_torch(batch_size):
    # The watchdog counts each item the Dataset's iterator gives; a generator doing so ended at the
    # first exception, and the rest of the worker's items were lost without an error.
    def read(loader_class, num_workers):
        out = []
        iterator = iter(loader_class(Flaky(), batch_size=batch_size, num_workers=num_workers))
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return out
            except ValueError as error:
                out.append(str(error).splitlines()[0])
            else:
                out.append(batch.tolist() if isinstance(batch, torch.Tensor) else batch)

    ours = read(DataLoader, 2)
    assert ours == read(TorchDataLoader, 2)
    assert ours.count("Caught ValueError in DataLoader worker process 0.") == 2, ours  # items 8 and 18
    assert ours[-1] == (19 if batch_size is None else [15, 17, 19]), ours  # read on to each worker's end


def test_worker_rng_seeding_equals_torch_fork_loader():
    torch_batches = as_lists(
        TorchDataLoader(RandomPerItem(), batch_size=3, num_workers=2, generator=torch.Generator().manual_seed(3))
    )
    ours = as_lists(
        DataLoader(RandomPerItem(), batch_size=3, num_workers=2, generator=torch.Generator().manual_seed(3))
    )
    assert ours == torch_batches


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=-1),
        dict(timeout=-1),
        dict(prefetch_factor=2),
        dict(num_workers=1, prefetch_factor=-1),
        dict(persistent_workers=True),
        dict(shuffle=True, sampler=EveryThird(23)),
        dict(batch_sampler=BatchSampler(EveryThird(23), 3, False), batch_size=2),
        dict(batch_size=None, drop_last=True),
        dict(multiprocessing_context="fork"),
        dict(num_workers=1, multiprocessing_context="nonsense"),
        dict(num_workers=1, multiprocessing_context=42),
    ],
)
def test_argument_errors_are_torchs(kwargs):
    with pytest.raises(Exception) as torch_error:
        TorchDataLoader(Squares(), **kwargs)
    with pytest.raises(type(torch_error.value)) as our_error:
        DataLoader(Squares(), **kwargs)
    assert str(our_error.value) == str(torch_error.value)


def test_iterable_dataset_argument_errors_are_torchs():
    for kwargs in (dict(shuffle=True), dict(sampler=EveryThird(3))):
        with pytest.raises(ValueError) as torch_error:
            TorchDataLoader(Counting(), **kwargs)
        with pytest.raises(ValueError, match="IterableDataset") as our_error:
            DataLoader(Counting(), **kwargs)
        assert str(our_error.value) == str(torch_error.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(zarrs_mode="turbo"), "zarrs_mode must be one of"),
        (dict(thread_budget=-2), "thread_budget must be None or an int from 1 to 1024, got -2"),
        (dict(stall_timeout="soon"), r"stall_timeout must be None \(off\) or a finite number of seconds > 0"),
        (dict(disable_hooks="zarrs"), "disable_hooks must be an iterable"),
        (dict(disable_hooks=["threadpool"]), r"registered hooks \(.*threadpools.*\), got unknown 'threadpool'"),
    ],
)
def test_bad_safeloader_options_fail_at_construction(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        DataLoader(Squares(), num_workers=1, **kwargs)


def test_the_loaders_own_keywords_are_exactly_the_options_each_documented_and_defaulted():
    import inspect

    from safeloader import DEFAULT, Options

    fields = [field.name for field in dataclasses.fields(Options)]
    parameters = inspect.signature(DataLoader.__init__).parameters
    keyword_only = [name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only == fields  # an option added to Options is a loader keyword too, and no other
    assert all(parameters[name].default is DEFAULT for name in fields)
    doc = DataLoader.__doc__ or ""
    assert [name for name in fields if f"``{name}``" not in doc] == []
    loader = DataLoader(Squares(), num_workers=1, on_unsafe_fork="raise", thread_budget=3)
    assert safeloader._loader.resolve_options(loader) == safeloader.get_options().replace(
        on_unsafe_fork="raise", thread_budget=3
    )


def test_every_init_argument_is_stored_under_its_name():
    generator = torch.Generator()
    loader = DataLoader(
        Squares(),
        batch_size=3,
        shuffle=True,
        num_workers=1,
        pin_memory=False,
        drop_last=True,
        timeout=5,
        worker_init_fn=print,
        generator=generator,
        prefetch_factor=3,
        persistent_workers=True,
        in_order=False,
        zarrs_mode="serial",
        thread_budget=1,
        freeze_gc=True,
        stall_timeout=9,
        disable_hooks=("zarrs",),
    )
    for name, value in dict(
        batch_size=3,
        shuffle=True,
        num_workers=1,
        pin_memory=False,
        drop_last=True,
        timeout=5,
        worker_init_fn=print,
        generator=generator,
        prefetch_factor=3,
        persistent_workers=True,
        in_order=False,
        zarrs_mode="serial",
        thread_budget=1,
        freeze_gc=True,
        stall_timeout=9,
        disable_hooks=("zarrs",),
    ).items():
        assert getattr(loader, name) == value, name
    assert loader.multiprocessing_context is None
    assert loader.dataset.__class__ is Squares


def test_loader_pickles_where_torchs_does():
    ours = pickle.loads(pickle.dumps(DataLoader(Squares(), batch_size=4, num_workers=2, zarrs_mode="serial")))
    assert isinstance(ours, safeloader.SafeDataLoader) and ours.zarrs_mode == "serial"
    assert as_lists(ours) == as_lists(TorchDataLoader(Squares(), batch_size=4))


def test_workers_fork_when_default_start_method_is_not_fork(monkeypatch):
    """Python 3.14 made forkserver the default; with no context given, safeloader still forks."""
    import safeloader._loader as loader_module

    monkeypatch.setattr(loader_module, "_fork_is_default", lambda: False)
    monkeypatch.setattr(torch.multiprocessing, "get_start_method", lambda allow_none=False: None)
    loader = DataLoader(Squares(), batch_size=4, num_workers=2)
    iterator = iter(loader)
    assert {type(w).__name__ for w in iterator._workers} == {"ForkProcess"}
    assert loader.multiprocessing_context is None  # the user's attribute is unchanged
    assert as_lists(iterator) == as_lists(TorchDataLoader(Squares(), batch_size=4))
    del iterator


@pytest.mark.timeout(120)
def test_explicit_spawn_context_is_respected(tmp_path):
    fired = []
    hook = safeloader.register_at_fork(before=lambda: fired.append(1), name="t.spawn_probe")
    try:
        loader = DataLoader(Squares(), batch_size=4, num_workers=1, multiprocessing_context="spawn")
        iterator = iter(loader)
        assert {type(w).__name__ for w in iterator._workers} == {"SpawnProcess"}
        assert as_lists(iterator) == as_lists(TorchDataLoader(Squares(), batch_size=4))
        assert fired == []  # spawn does not fork this process: no hook runs
        assert isinstance(loader.multiprocessing_context, multiprocessing.context.SpawnContext)
        del iterator
    finally:
        safeloader.unregister(hook)
