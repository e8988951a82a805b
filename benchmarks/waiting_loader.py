"""A Task whose items wait 5 ms each (a read from network storage) and whose model is small: the loader, not the model,
sets the pace, and loader workers past the cores keep adding speed (docs/benchmarks.md, "A loader that waits").

    autotune search --workload benchmarks.waiting_loader:make --trials 8 --trial-seconds 2 --device cpu
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset

import autotune

#: How long each item waits, in seconds.
WAIT_S = 0.005


class Waits(Dataset):  # type: ignore[type-arg]
    """4096 random 32-px images, each after a wait of :data:`WAIT_S`."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(WAIT_S)
        return torch.randn(3, 32, 32), index % 10


def make() -> autotune.Task:
    """The Task: a small CNN over the waiting dataset, batch 64."""
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10))
    return autotune.Task(model, Waits(), batch_size=64)
