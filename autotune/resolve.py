"""Turn what the user typed (device, model, data) into a checked Workload.

Everything here runs in the parent before any trial, so that bad input fails
fast with one line, before a child process is started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def visible_gpus(gpus: list[Any], cuda_visible_devices: str | None) -> list[Any]:
    """The NVML GPUs in the order CUDA numbers them under ``CUDA_VISIBLE_DEVICES``.

    NVML lists every GPU of the machine; CUDA (and ``cuda:K``) counts only
    the visible ones, in the order the variable gives. Entries are NVML
    indices or (abbreviated) ``GPU-`` UUIDs; as in CUDA, the list ends at the
    first entry that names no device (``-1``, an index out of range).
    Integer indices assume CUDA enumerates GPUs in PCI order, as NVML does
    (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and the usual case on machines with
    one GPU model).

    Raises:
        UsageError: A MIG instance (``MIG-...``), which NVML's GPU list
            cannot describe.
    """
    if cuda_visible_devices is None:
        return list(gpus)
    visible: list[Any] = []
    for token in (t.strip() for t in cuda_visible_devices.split(",")):
        if token.upper().startswith("MIG-"):
            raise UsageError(
                f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} names a MIG instance; "
                "autotune reads GPUs through NVML and cannot size a MIG slice yet: use a full GPU"
            )
        if token.upper().startswith("GPU-"):
            matches = [g for g in gpus if str(getattr(g, "uuid", "") or "").upper().startswith(token.upper())]
            gpu = matches[0] if len(matches) == 1 else None
        elif token.isdigit() and int(token) < len(gpus):
            gpu = gpus[int(token)]
        else:
            gpu = None
        if gpu is None or any(g is gpu for g in visible):
            break
        visible.append(gpu)
    return visible


def resolve_device(text: str, hardware: object) -> DeviceInfo:
    """Resolve ``auto``, ``cpu``, ``cuda`` or ``cuda:K`` against the probe.

    ``K`` counts the GPUs CUDA sees (``CUDA_VISIBLE_DEVICES`` applies), as
    ``torch.device("cuda:K")`` does.

    Args:
        text: What the user asked for.
        hardware: A ``probes.Hardware`` (GPUs come from NVML, so CUDA is not
            initialised in this process).

    Raises:
        UsageError: CUDA asked for but absent, or an index out of range.
    """
    hidden = getattr(hardware, "cuda_visible_devices", None)
    gpus = visible_gpus(list(getattr(hardware, "gpus", []) or []), hidden)
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
            if hidden is not None and getattr(hardware, "gpus", None):
                reason = f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
            raise UsageError(f"device {text!r} asked for, but no CUDA GPU is usable: {reason}")
        index = int(index_text)
        if index >= len(gpus):
            where = "visible" if hidden is not None else "present"
            raise UsageError(f"device {text!r}: only {len(gpus)} GPU(s) {where} (cuda:0..cuda:{len(gpus) - 1})")
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
