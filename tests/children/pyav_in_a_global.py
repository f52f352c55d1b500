"""A PyAV input container in a module global, not in the Dataset (decoder threading "AUTO"), decoded
once in the parent; 2 workers seek and decode 6 items through the global.

The pyav backend reopens only the containers a Dataset holds: this one it cannot see, and its
threads are a hazard like an unknown pool's. argv: ``torch`` or ``safeloader`` (whose DataLoader,
default options), the video file. Prints the items (each with whether its worker is a child of this
process), ``EXPECTED`` and the items read in this process, then every warning.
"""

import os
import sys
import warnings

import av
import torch

import safeloader

which, path = sys.argv[1:]
STEP = 7  # item i is frame i * STEP
_container = None


def container() -> av.container.InputContainer:
    global _container
    if _container is None:
        _container = av.open(path)
        _container.streams.video[0].thread_type = "AUTO"  # FFmpeg's threads start at the first decode
    return _container


class FramesOfTheGlobalContainer(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.parent = os.getpid()

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[int, int, bool]:
        video = container()
        video.seek(0, stream=video.streams.video[0])
        for n, frame in enumerate(video.decode(video=0)):
            if n == index * STEP:
                return index, int(frame.to_ndarray(format="rgb24").astype("int64").sum()), os.getppid() == self.parent
        raise IndexError(index)


if __name__ == "__main__":  # forkserver workers import this file as __mp_main__
    dataset = FramesOfTheGlobalContainer()
    expected = [dataset[i][:2] for i in range(6)]  # the parent's decoder threads run now
    loader_class = torch.utils.data.DataLoader if which == "torch" else safeloader.DataLoader
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        print(sorted(loader_class(dataset, batch_size=None, num_workers=2)), flush=True)
    print("EXPECTED", expected)
    for warning in caught:
        if issubclass(warning.category, DeprecationWarning) and "multi-threaded" in str(warning.message):
            continue  # Python 3.12+ on any fork with live threads: torch's loader gets it too
        print(f"{warning.category.__name__}: {warning.message}")
