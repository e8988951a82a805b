"""Turn what the user typed (device, model, data) into a checked Workload.

Everything here runs in the parent before any trial, so that bad input fails
fast with one line, before a child process is started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import UsageError
from autotune.workload import Workload


@dataclass(frozen=True)
class DeviceInfo:
    """The device trials run on, as the probe saw it."""

    name: str  # "cpu", "cuda:0", ...
    bf16: bool
    memory_total_bytes: int | None
    memory_free_bytes: int | None
    label: str

    @property
    def type(self) -> str:
        """``cpu`` or ``cuda``."""
        return self.name.split(":", 1)[0]


def resolve_device(text: str, hardware: object) -> DeviceInfo:
    """Resolve ``auto``, ``cpu``, ``cuda`` or ``cuda:K`` against the probe.

    Args:
        text: What the user asked for.
        hardware: A ``probes.Hardware`` (GPUs come from NVML, so CUDA is not
            initialised in this process).

    Raises:
        UsageError: CUDA asked for but absent, or an index out of range.
    """
    gpus = list(getattr(hardware, "gpus", []) or [])
    cpu = hardware.cpu
    choice = text.strip().lower()
    if choice == "auto":
        choice = "cuda:0" if gpus else "cpu"
    if choice == "cpu":
        model = getattr(cpu, "model", None) or "CPU"
        return DeviceInfo("cpu", bool(getattr(cpu, "bf16", False)), None, None, str(model))
    if choice == "cuda":
        choice = "cuda:0"
    if choice.startswith("cuda:"):
        index_text = choice.split(":", 1)[1]
        if not index_text.isdigit():
            raise UsageError(f"bad device {text!r}; use auto, cpu, cuda or cuda:K")
        if not gpus:
            reason = getattr(hardware, "gpu_error", None) or "no GPU found"
            raise UsageError(f"device {text!r} asked for, but no CUDA GPU is usable: {reason}")
        index = int(index_text)
        if index >= len(gpus):
            raise UsageError(f"device {text!r}: only {len(gpus)} GPU(s) present (cuda:0..cuda:{len(gpus) - 1})")
        gpu = gpus[index]
        return DeviceInfo(
            f"cuda:{index}",
            bool(getattr(gpu, "bf16", False)),
            getattr(gpu, "memory_total_bytes", None),
            getattr(gpu, "memory_free_bytes", None),
            str(getattr(gpu, "name", "GPU")),
        )
    raise UsageError(f"bad device {text!r}; use auto, cpu, cuda or cuda:K")


def build_workload(
    *,
    model: str,
    image_size: int,
    data: Path | None,
    device: str,
    cache_dir: Path | None = None,
    synthetic_images: int = 2000,
    lr: float = 1e-3,
) -> Workload:
    """Check the model and data and return a ready Workload.

    Synthetic data is generated here (once) so that no trial pays for it.

    Raises:
        WorkloadError: Unknown model, unimportable factory, missing or empty data.
    """
    from autotune.data import SYNTHETIC_CLASSES, check_image_folder, ensure_synthetic
    from autotune.models import check_factory, check_model_name

    sys_path = (os.getcwd(),)
    check_model_name(model)
    check_factory(model, sys_path)
    if data is not None:
        folder = check_image_folder(data)
        num_classes, images = folder.classes, folder.images
        data_text: str | None = str(data.resolve())
    else:
        ensure_synthetic(cache_dir, synthetic_images)
        num_classes, images = SYNTHETIC_CLASSES, synthetic_images
        data_text = None
    return Workload(
        model=model,
        image_size=image_size,
        data=data_text,
        device=device,
        num_classes=num_classes,
        images=images,
        lr=lr,
        synthetic_images=synthetic_images,
        cache_dir=str(Path(cache_dir).resolve()) if cache_dir else None,
        sys_path=sys_path,
    )
