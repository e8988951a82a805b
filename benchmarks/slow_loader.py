"""A workload whose loader workers are slower than its training step, for checking how a trial values it.

Each item takes ``ITEM_S`` seconds to read (default 0.05: a worker makes a
batch of 64 in 3.2 s) and the step sleeps ``STEP_S`` seconds per sample
(default 0.005: 200 samples/s). With 8 workers the loader makes at most
160 samples/s, which is what a long trial measures::

    autotune trial --workload benchmarks.slow_loader:make_task --workers 8 --prefetch 1 --batch-size 64 \\
        --device cpu --trial-seconds 2 --json

Sleeps, not work: the rates hold on a loaded machine too (they can only be lower).
``make_occasional_task`` is a loader whose batches cost what their items
drew (every 50th item sleeps 0.2 s): a worker's one quick batch must not
set the loader's rate (docs/trial.md, "What is measured", item 4).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

import autotune

ITEM_S = float(os.environ.get("ITEM_S", "0.05"))
STEP_S = float(os.environ.get("STEP_S", "0.005"))


class SlowItems(Dataset):  # type: ignore[type-arg]
    """100,000 items of 8 zeros, each ``ITEM_S`` seconds to read."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(ITEM_S)
        return torch.zeros(8), index % 2


def step(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy of a linear layer, after ``STEP_S`` seconds per sample."""
    inputs, targets = batch
    time.sleep(STEP_S * len(targets))
    return nn.functional.cross_entropy(model(inputs), targets)


def make_task() -> autotune.Task:
    """The Task: a linear layer over :class:`SlowItems`, batch 64."""
    return autotune.Task(model=lambda: nn.Linear(8, 2), dataset=SlowItems(), step=step, batch_size=64)


class OccasionallySlowItems(Dataset):  # type: ignore[type-arg]
    """5,000 items, every 50th taking 0.2 s to read: a batch's cost depends on which items it drew."""

    def __len__(self) -> int:
        return 5000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index % 50 == 0:
            time.sleep(0.2)
        x = torch.randn(8, generator=torch.Generator().manual_seed(index))
        return x, int(x.sum() > 0)


def make_occasional_task() -> autotune.Task:
    """A small MLP over :class:`OccasionallySlowItems`, batch 32: 4 workers make about 1,000 samples/s."""
    return autotune.Task(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), OccasionallySlowItems(), batch_size=32)
