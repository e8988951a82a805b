"""Workload: what is trained (model, data, image size, device).

The spec is a plain dataclass so it crosses into trial child processes as
JSON. Building the real objects (model, dataset) lives in
:mod:`autotune.models` and :mod:`autotune.data`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.errors import UsageError


@dataclass(frozen=True)
class Workload:
    """What a trial trains.

    Attributes:
        model: A torchvision classification model name (``"resnet50"``) or a
            user factory ``"package.module:function"`` returning an nn.Module.
        image_size: Side of the square crop fed to the model.
        data: An ImageFolder directory, or ``None`` for synthetic JPEGs.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:K"`` (already resolved).
        num_classes: Classes in the data (filled in from the data).
        images: Training images in the data (filled in from the data); an
            optimizer step must fit in one epoch of them.
        lr: AdamW learning rate at the reference effective batch.
        synthetic_images: Files in the synthetic dataset (when ``data`` is None).
        cache_dir: Where synthetic data is generated (``None``: the default cache).
        sys_path: Extra import paths for a user factory (the caller's cwd).
    """

    model: str
    image_size: int = 224
    data: str | None = None
    device: str = "cpu"
    num_classes: int | None = None
    images: int | None = None
    lr: float = 1e-3
    synthetic_images: int = 2000
    cache_dir: str | None = None
    sys_path: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.image_size, int) or self.image_size < 8:
            raise UsageError(f"image size must be an integer >= 8, got {self.image_size!r}")
        if self.synthetic_images < 16:
            raise UsageError(f"synthetic_images must be >= 16, got {self.synthetic_images}")
        if self.images is not None and self.images < 1:
            raise UsageError(f"images must be >= 1, got {self.images}")
        if not self.lr > 0:
            raise UsageError(f"learning rate must be > 0, got {self.lr}")

    @property
    def device_type(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return self.device.split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        data = asdict(self)
        data["sys_path"] = list(self.sys_path)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Workload":
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data["sys_path"] = tuple(data.get("sys_path", ()))
        return cls(**data)

    def to_json(self) -> str:
        """The workload as a JSON string."""
        return json.dumps(self.to_dict())
