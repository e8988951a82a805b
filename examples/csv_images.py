"""An image classifier over a custom Dataset: a CSV of file paths and labels, not an ImageFolder.

``CsvImages`` reads ``labels.csv`` (``path,label`` rows) in ``__init__`` and
opens each image file with PIL in ``__getitem__``, so the loader does the
real decode work. ``make_task`` writes 96 small PNG files and their CSV once
(into ``$TMPDIR/autotune-example-csv-images``). Tune it with::

    cd examples && autotune search --workload csv_images:make_task --trials 3 --trial-seconds 1 --device cpu

or run this file (Python API, then the emitted ``train.py`` for two steps).
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

import autotune

IMAGES = 96
CLASSES = 4
SIZE = 32


class CsvImages(Dataset):
    """Images listed in a CSV file (``path,label`` per row, paths relative to the file)."""

    def __init__(self, csv_file: str | Path) -> None:
        self.root = Path(csv_file).parent
        with open(csv_file, newline="") as handle:
            self.rows = [(row["path"], int(row["label"])) for row in csv.DictReader(handle)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import numpy as np
        from PIL import Image

        path, label = self.rows[index]
        with Image.open(self.root / path) as image:
            pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous(), label


def write_files(directory: Path) -> Path:
    """Write IMAGES small PNGs and ``labels.csv`` once (atomically); return the CSV path."""
    import numpy as np
    from PIL import Image

    target = directory / "labels.csv"
    if target.exists():
        return target
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for index in range(IMAGES):
        label = index % CLASSES
        pixels = rng.integers(0, 64, size=(SIZE, SIZE, 3), dtype=np.uint8)
        pixels[..., label % 3] += np.uint8(96 + 32 * (label // 3))
        name = f"images/{index:04d}.png"
        Image.fromarray(pixels).save(tmp / name)
        rows.append({"path": name, "label": label})
    with open(tmp / "labels.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["path", "label"])
        writer.writeheader()
        writer.writerows(rows)
    try:
        os.rename(tmp, directory)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def small_cnn() -> nn.Module:
    """A small convnet for 32 x 32 RGB images."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES),
    )


def make_task() -> autotune.Task:
    """The CSV-listed images (written once), a small CNN, cross-entropy, SGD with momentum."""
    csv_file = write_files(Path(tempfile.gettempdir()) / "autotune-example-csv-images")
    return autotune.Task(
        model=small_cnn,
        dataset=CsvImages(csv_file),
        loss=nn.CrossEntropyLoss(),
        optimizer=lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
        batch_size=16,
        lr=0.05,
    )


if __name__ == "__main__":
    from _run_example import run_example

    sys.exit(run_example("csv_images:make_task", *sys.argv[1:2]))
