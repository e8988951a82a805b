"""A segmentation-style workload: dict items, a model that returns a dict, ``step()`` computes the loss.

Each item is ``{"image": float[3, H, W], "mask": long[H, W]}``; the model
returns ``{"out": logits, "aux": logits}`` (as torchvision's segmentation
models do), and ``step`` weighs the two cross-entropies. The image is 4-D
after collation, so ``channels_last`` is searched. Tune it with::

    cd examples && autotune search --workload segmentation:make_task --trials 3 --trial-seconds 1 --device cpu

or run this file (Python API, then the emitted ``train.py`` for two steps).
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import Dataset

import autotune

CLASSES = 3


class Shapes(Dataset):
    """Images with a bright square; the mask marks the square's class (by colour channel), background 0."""

    def __init__(self, samples: int, size: int) -> None:
        self.samples, self.size = samples, size

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(index)
        image = torch.rand(3, self.size, self.size, generator=gen) * 0.2
        mask = torch.zeros(self.size, self.size, dtype=torch.long)
        side = self.size // 3
        y, x = (int(v) for v in torch.randint(0, self.size - side, (2,), generator=gen))
        label = index % (CLASSES - 1) + 1
        image[label - 1, y : y + side, x : x + side] += 0.8
        mask[y : y + side, x : x + side] = label
        return {"image": image, "mask": mask}


class TinySegmenter(nn.Module):
    """An encoder-decoder that returns the main and an auxiliary head, as a dict."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        )
        self.decoder = nn.Sequential(nn.ConvTranspose2d(width, width, 2, stride=2), nn.ReLU(), nn.Conv2d(width, CLASSES, 1))
        self.aux = nn.Conv2d(width, CLASSES, 1)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.encoder(image)
        aux = nn.functional.interpolate(self.aux(features), size=image.shape[-2:], mode="bilinear", align_corners=False)
        return {"out": self.decoder(features), "aux": aux}


def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Main loss plus 0.4 x the auxiliary loss (torchvision's segmentation recipe)."""
    outputs = model(batch["image"])
    main = nn.functional.cross_entropy(outputs["out"], batch["mask"])
    return main + 0.4 * nn.functional.cross_entropy(outputs["aux"], batch["mask"])


def make_task() -> autotune.Task:
    """The tiny size the tests tune: 128 images of 32 x 32 pixels."""
    return autotune.Task(model=TinySegmenter, dataset=Shapes(samples=128, size=32), step=step, batch_size=16, lr=1e-3)


if __name__ == "__main__":
    from _run_example import run_example

    sys.exit(run_example("segmentation:make_task", *sys.argv[1:2]))
