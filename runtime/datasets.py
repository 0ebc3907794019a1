"""Image folders: files found recursively, labels from the first level of sub-folders."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import CalibrationError

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm"})


def image_files(folder: str | Path) -> list[str]:
    """Image files under `folder`, recursively, sorted by path. (os.scandir: about 1 us a file.) A name with
    an image suffix that is no readable file (a dangling symlink, a FIFO) is listed too, so the reader skips
    and counts it as it does an unreadable image; a folder reached twice (a symlink loop) is walked once."""
    found: list[str] = []
    stack = [os.fspath(folder)]
    seen: set[tuple[int, int]] = set()
    while stack:
        top = stack.pop()
        try:
            info = os.stat(top)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        with os.scandir(top) as entries:
            for entry in entries:
                name = entry.name
                dot = name.rfind(".")
                if dot > 0 and name[dot:].lower() in IMAGE_SUFFIXES and not _is_dir(entry):
                    found.append(entry.path)
                elif _is_dir(entry):
                    stack.append(entry.path)
    found.sort()
    return found


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a symlink loop
        return False


@dataclass(frozen=True)
class ImageFolder:
    """Images under `root`. `classes` are the sorted names of the sub-folders that hold images;
    `labels[i]` is the class index of `files[i]`, or -1 for images lying directly in `root`."""

    root: Path
    files: tuple[Path, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]

    @classmethod
    def scan(cls, root: str | Path) -> ImageFolder:
        root = Path(root)
        if not root.is_dir():
            raise CalibrationError(f"{root}: not a folder")
        files = [Path(p) for p in image_files(root)]
        if not files:
            raise CalibrationError(
                f"{root}: no images found (looked for {', '.join(sorted(IMAGE_SUFFIXES))})"
            )
        top = [p.relative_to(root).parts for p in files]
        classes = tuple(sorted({parts[0] for parts in top if len(parts) > 1}))
        index = {c: i for i, c in enumerate(classes)}
        labels = tuple(index[parts[0]] if len(parts) > 1 else -1 for parts in top)
        return cls(root, tuple(files), labels, classes)

    @property
    def labelled(self) -> bool:
        return bool(self.classes) and all(label >= 0 for label in self.labels)

    def sample(self, n: int | None, seed: int = 0) -> ImageFolder:
        """A seeded shuffle of the files, cut to `n` (all when None)."""
        order = list(range(len(self.files)))
        random.Random(seed).shuffle(order)
        if n is not None:
            order = order[:n]
        return ImageFolder(
            self.root,
            tuple(self.files[i] for i in order),
            tuple(self.labels[i] for i in order),
            self.classes,
        )
