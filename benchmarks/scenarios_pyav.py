"""The PyAV scenario: a video container the Dataset opens in ``__init__``, its decoder threaded.

Each item seeks to one of the video's keyframes (item i: keyframe ``i % KEYFRAMES``) and
decodes ``FRAMES`` frames from there, reduced to their means (as a clip sampler's features
are). The Dataset opens the file with ``av.open`` in ``__init__``, sets its video stream's
``thread_type = "AUTO"`` (FFmpeg's frame and slice threads) and the parent decodes an item
first, which starts the decoder's threads. torch's forked workers then wait forever on their
first decode (the decoder is inherited without its threads; hung in libavcodec). The usual
workaround opens the container lazily in each worker (a pid check on first use), the parent
closing its own after its read; forkserver and spawn need it as well (a container does not
pickle). safeloader's ``pyav`` backend opens each worker's own copy of the container, with
the same thread settings, where the Dataset holds it.

The thread-based contenders are left out: the Dataset's one container has one read position
and one decoder, which two threads seeking and decoding at once would share (a thread pool
needs a container per thread).

Each measurement reports the epoch's time (``seconds``) and the time to its first batch
(``first_batch_s``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .contenders import PRELOAD, Measure, Setup, epoch, lazy_per_worker, loader_kinds

SIZE = 128  # pixels, square
RATE = 25  # frames per second
SECONDS = 10
GOP = 25  # a keyframe every second
KEYFRAMES = RATE * SECONDS // GOP
FRAMES = 8  # frames decoded per item


def write_video(directory: Path, items: int) -> dict[str, Any]:
    """A 10 s H.264 clip (MPEG-4 part 2 without x264); the keyframes' timestamps and the checksum
    of an epoch decoded directly."""
    import av

    path = directory / "clip.mp4"
    rng = np.random.default_rng(5)
    y, x = np.mgrid[:SIZE, :SIZE]
    with av.open(str(path), "w") as container:
        try:
            stream = container.add_stream("libx264", rate=RATE,
                                          options={"keyint": str(GOP), "min-keyint": str(GOP), "scenecut": "0"})
        except (av.FFmpegError, ValueError):  # a PyAV build without x264
            stream = container.add_stream("mpeg4", rate=RATE)
        stream.width = stream.height = SIZE
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = GOP
        for i in range(RATE * SECONDS):
            image = np.empty((SIZE, SIZE, 3), np.uint8)
            image[..., 0] = (128 + 100 * np.sin((x + 2 * i) / 9)).clip(0, 255)
            image[..., 1] = (128 + 100 * np.cos((y - i) / 13)).clip(0, 255)
            image[..., 2] = rng.integers(0, 64, (SIZE, SIZE)) + i % 64
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:  # the direct read: every frame, in order, one thread
        frames = [(frame.pts, frame.key_frame, frame_mean(frame)) for frame in container.decode(video=0)]
    starts = [n for n, (_pts, key, _mean) in enumerate(frames) if key]
    assert len(starts) == KEYFRAMES, starts
    sums = [sum(mean for _pts, _key, mean in frames[n:n + FRAMES]) for n in starts]
    return {"video": str(path), "pyav_items": items, "keyframes": [frames[n][0] for n in starts],
            "pyav_checksum": sum(sums[i % KEYFRAMES] for i in range(items))}


def frame_mean(frame: Any) -> float:
    """The mean of a decoded frame's planes (its Y, U and V samples, as FFmpeg left them)."""
    return float(frame.to_ndarray().mean(dtype=np.float64))


class VideoClips(Dataset):
    """Item i: the means of ``FRAMES`` frames from keyframe ``i % KEYFRAMES`` of a video.

    The container is opened in ``__init__`` with a threaded decoder and read there once (the
    natural code); ``lazy`` (the usual workaround) closes it after that read and opens it on
    first use in each process.
    """

    def __init__(self, path: str, keyframes: list[int], count: int, lazy: bool = False) -> None:
        self.path, self.keyframes, self.count, self.lazy = path, keyframes, count, lazy
        self.container, self.stream = self.open()
        self.pid: int | None = os.getpid()
        self[0]  # the parent decodes first: the decoder's threads start here
        if lazy:
            self.container.close()
            self.container, self.stream, self.pid = None, None, None

    def open(self) -> tuple[Any, Any]:
        import av

        container = av.open(self.path)
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        return container, stream

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.lazy and self.pid != os.getpid():
            (self.container, self.stream), self.pid = self.open(), os.getpid()
        target = self.keyframes[index % KEYFRAMES]
        self.container.seek(target, stream=self.stream)  # lands on that keyframe
        means = []
        for frame in self.container.decode(self.stream):
            if frame.pts is None or frame.pts < target:
                continue
            means.append(frame_mean(frame))
            if len(means) == FRAMES:
                break
        return torch.tensor(means, dtype=torch.float64)


def pyav_contender(kind: str, lazy: bool = False) -> Setup:
    def setup(params: dict) -> Measure:
        dataset = VideoClips(params["video"], params["keyframes"], params["pyav_items"], lazy=lazy)
        build = loader_kinds(preload=[*PRELOAD, __name__])[kind]
        return lambda: epoch(build, dataset, params["pyav_checksum"], first_batch=True, batch_size=8,
                             num_workers=2)

    return setup


def table() -> dict[str, dict[str, Setup]]:
    return {
        "PyAV container opened in __init__, threaded decoder": {
            "torch fork": pyav_contender("torch fork"),
            **lazy_per_worker(pyav_contender),
            "num_workers=0": pyav_contender("num_workers=0"),
            "safeloader": pyav_contender("safeloader"),
        }
    }
