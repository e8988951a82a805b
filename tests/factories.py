"""Model factories used by the tests as ``factories:NAME`` references."""

from __future__ import annotations

import os
import time

import torch
from torch import nn


def tiny_cnn(num_classes: int = 10) -> nn.Module:
    """A small convnet that trains in milliseconds."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, num_classes),
    )


def tiny_mlp(num_classes: int = 10) -> nn.Module:
    """Pooling and one linear layer: the cheapest model torch.compile can compile."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(12, num_classes))


def broken(num_classes: int = 10) -> nn.Module:
    """A factory that fails with a clear message."""
    raise ValueError("factory exploded on purpose")


def wrong_shape(num_classes: int = 10) -> nn.Module:
    """A model whose forward fails on the input shape (expects 1 channel, gets 3)."""
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))


def sleeps_forever() -> nn.Module:
    """A factory that never returns."""
    while True:
        time.sleep(1)


def spins_forever() -> nn.Module:
    """A factory that never returns and computes all the while (a slow step's CPU use)."""
    while True:
        pass


class _NaN(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.inner = tiny_cnn(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * float("nan")


def makes_nan(num_classes: int = 10) -> nn.Module:
    """A model whose output (and so loss) is NaN."""
    return _NaN(num_classes)


def not_a_module() -> str:
    """A factory that returns the wrong type."""
    return "not a module"


def chatty(num_classes: int = 10) -> nn.Module:
    """A factory that prints, as user code does."""
    print("hello from the factory", flush=True)  # written at once: a test reads the trial's log right after its result
    return tiny_cnn(num_classes)


class _Slow(nn.Module):
    def __init__(self, num_classes: int, seconds: float) -> None:
        super().__init__()
        self.inner = tiny_cnn(num_classes)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.inner(x)


def slow_step(num_classes: int = 10) -> nn.Module:
    """A model whose every forward takes 0.4 s, longer than a short trial's window."""
    return _Slow(num_classes, 0.4)


#: The environment variable naming :func:`gated_cnn`'s gate file.
GATE_ENV = "AUTOTUNE_TEST_GATE"


class _Gated(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.inner = tiny_cnn(num_classes)
        self.trial: bool | None = None  # read at the first forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from task_factories import in_a_trial

        gate = os.environ.get(GATE_ENV)
        if self.trial is None:
            self.trial = bool(gate) and in_a_trial()
        while self.trial and os.path.exists(gate or ""):
            time.sleep(0.02)
        return self.inner(x)


def gated_cnn(num_classes: int = 10) -> nn.Module:
    """:func:`tiny_cnn` whose every forward, in a trial process, waits while the file named by ``$AUTOTUNE_TEST_GATE``
    exists (a forward in the search's own process, a check of the model, does not).

    A trial of it stays RUNNING until a test removes the gate, however loaded the machine: a signal sent to its search
    lands mid-trial for certain (a 1-s trial of :func:`tiny_cnn` could end between two looks at the study).
    """
    return _Gated(num_classes)


def frozen_cnn(num_classes: int = 10) -> nn.Module:
    """A fine-tuning recipe's classifier: its backbone frozen and in eval mode (its BatchNorm keeps its running
    statistics), the head trains."""
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    backbone.requires_grad_(False)
    backbone.eval()
    return nn.Sequential(backbone, nn.Linear(4, num_classes))


def records_environment(num_classes: int = 10) -> nn.Module:
    """tiny_cnn, whose factory appends its process id and ``AUTOTUNE_TEST_MARK`` to the file ``AUTOTUNE_TEST_MARK_LOG``
    names: which environment a trial process runs with."""
    with open(os.environ["AUTOTUNE_TEST_MARK_LOG"], "a") as file:
        file.write(f"{os.getpid()} {os.environ.get('AUTOTUNE_TEST_MARK')}\n")
    return tiny_cnn(num_classes)
