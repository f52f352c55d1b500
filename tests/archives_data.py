"""gzip, bz2, tar, zip and image files, and the Dataset over them, that test_archives_and_images
and its child processes read."""

from __future__ import annotations

import bz2
import gzip
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

RECORD = 256
COUNT = 64
IMAGES = 8
SIDE = 384
ARCHIVES = ("gzip", "bz2", "tar", "tar.gz", "zip")
IMAGE_KINDS = ("png", "jpeg", "tiff")


def records() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (COUNT, RECORD), dtype=np.uint8)


def pictures() -> np.ndarray:
    """Noisy images, different from each other: large enough files that decoding one takes many reads."""
    return np.random.default_rng(1).integers(0, 256, (IMAGES, SIDE, SIDE, 3), dtype=np.uint8)


def write(kind: str, directory: Path) -> str:
    """Write the test data in ``kind``'s format; returns its path (a directory for png/jpeg)."""
    data = records()
    path = directory / f"data.{kind}"
    if kind in ("gzip", "bz2"):
        with (gzip.open if kind == "gzip" else bz2.open)(path, "wb") as f:
            f.write(data.tobytes())
    elif kind in ("tar", "tar.gz"):
        with tarfile.open(path, "w:gz" if kind == "tar.gz" else "w") as tar:
            for i, row in enumerate(data):
                info = tarfile.TarInfo(f"m{i}")
                info.size = RECORD
                tar.addfile(info, io.BytesIO(row.tobytes()))
    elif kind == "zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for i, row in enumerate(data):
                archive.writestr(f"m{i}", row.tobytes())
    elif kind == "tiff":
        frames = [Image.fromarray(p) for p in pictures()]
        frames[0].save(path, save_all=True, append_images=frames[1:])
    else:
        path.mkdir()
        for k, p in enumerate(pictures()):
            Image.fromarray(p).save(path / f"{k}.{kind}")
    return str(path)


class Opened(Dataset):
    """Item i, read through a handle opened here (images: opened lazily, not decoded)."""

    def __init__(self, kind: str, path: str) -> None:
        self.kind = kind
        if kind in ("gzip", "bz2"):
            self.file = (gzip.open if kind == "gzip" else bz2.open)(path, "rb")
        elif kind in ("tar", "tar.gz"):
            self.tar = tarfile.open(path)
            self.members = self.tar.getmembers()
        elif kind == "zip":
            self.zip = zipfile.ZipFile(path)
        elif kind == "tiff":
            self.image = Image.open(path)
        else:
            self.images = [Image.open(f"{path}/{k}.{kind}") for k in range(IMAGES)]
        if kind not in ("png", "jpeg"):
            self[0]  # the parent reads first (lazy images stay undecoded in the parent)

    def __len__(self) -> int:
        return IMAGES if self.kind in IMAGE_KINDS else COUNT

    def __getitem__(self, i: int):
        if self.kind in ("gzip", "bz2"):
            self.file.seek(i * RECORD)
            body = self.file.read(RECORD)
        elif self.kind in ("tar", "tar.gz"):
            body = self.tar.extractfile(self.members[i]).read()
        elif self.kind == "zip":
            body = self.zip.read(f"m{i}")
        elif self.kind == "tiff":
            self.image.seek(i)
            return i, np.asarray(self.image.convert("RGB"))
        else:
            return i, np.asarray(self.images[i].convert("RGB"))
        return i, np.frombuffer(body, np.uint8).copy()


def expected(kind: str, path: str) -> np.ndarray:
    """A direct read, in this process, through fresh handles (num_workers=0 semantics)."""
    fresh = Opened(kind, path)
    return np.stack([fresh[i][1] for i in range(len(fresh))])


def opened_case(kind: str, path: str) -> tuple[Opened, np.ndarray]:
    """For ``assert_torch_loader_fails``: Opened over ``path``, and its direct read."""
    return Opened(kind, path), expected(kind, path)
