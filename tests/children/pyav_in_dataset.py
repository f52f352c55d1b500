"""A Dataset holding a PyAV input container and its video stream (decoder threading "AUTO"),
opened in __init__ and decoded once in the parent; 2 workers seek and decode 6 items.

argv: ``torch`` or ``safeloader`` (whose DataLoader), the video file, then ``default``
(safeloader's default options, one epoch) or ``persistent`` (persistent workers, two epochs;
the Dataset also keeps the stream's codec context and the container in a list). Prints each
epoch's items (each with whether its worker is a child of this process and its decoder's
thread type), the items read in this process, every warning, then whether the parent's
container still decodes the same frames, and the worker processes left.
"""

import os
import sys
import warnings

import av
import torch
from workers_left import workers_left

import safeloader

which, path, variant = sys.argv[1:]
PARENT = os.getpid()
STEP = 7  # item i is frame i * STEP


class VideoFrames(torch.utils.data.Dataset):
    def __init__(self, path: str) -> None:
        self.container = av.open(path)
        self.stream = self.container.streams.video[0]
        self.stream.thread_type = "AUTO"  # FFmpeg's frame and slice threads, started at the first decode
        if variant == "persistent":
            self.codec_context = self.stream.codec_context
            self.held = [self.container]

    def __len__(self) -> int:
        return 6

    def frame(self, number: int) -> int:
        self.container.seek(0, stream=self.stream)
        for n, frame in enumerate(self.container.decode(self.stream)):
            if n == number:
                return int(frame.to_ndarray(format="rgb24").astype("int64").sum())
        raise IndexError(number)

    def __getitem__(self, index: int) -> tuple:
        if variant == "persistent":
            assert self.codec_context is self.stream.codec_context and self.held[0] is self.container
        checksum = self.frame(index * STEP)
        return index, checksum, os.getppid() == PARENT, self.stream.codec_context.thread_type.name


if __name__ == "__main__":
    dataset = VideoFrames(path)
    expected = [dataset[i][:2] for i in range(6)]  # the parent's decoder threads run: torch's workers hang
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if which == "torch":
            loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
            epochs = 1
        elif variant == "default":
            loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=2)
            epochs = 1
        else:
            loader = safeloader.DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
            epochs = 2
        for _ in range(epochs):
            print(sorted(tuple(item) for item in loader), flush=True)
        del loader
    print("EXPECTED", expected)
    for warning in caught:
        if issubclass(warning.category, DeprecationWarning) and "multi-threaded" in str(warning.message):
            continue  # Python 3.12+ on any fork with live threads: torch's loader gets it too
        print(f"{warning.category.__name__}: {warning.message}")
    again = [dataset[i][:2] for i in range(6)]
    print("PARENT", again == expected, dataset.stream.codec_context.thread_type.name)
    dataset.container.close()
    print("LEFT", len(workers_left()))
