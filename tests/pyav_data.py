"""A small video for the PyAV tests, encoded with PyAV itself: 48 frames of 64x64, each different."""

from __future__ import annotations

from pathlib import Path

FRAMES = 48


def write_video(path: Path) -> Path:
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        try:
            stream = container.add_stream("libx264", rate=24)  # H.264: FFmpeg decodes it with frame and slice threads
        except (av.FFmpegError, ValueError):  # a PyAV build without x264
            stream = container.add_stream("mpeg4", rate=24)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        for i in range(FRAMES):
            image = np.zeros((64, 64, 3), np.uint8)
            image[:, :, 0] = i * 5
            image[i % 64, :, 1] = 255
            image[:, (3 * i) % 64, 2] = 200
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
