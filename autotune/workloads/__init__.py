"""What is trained: models, data, and the checked :class:`~autotune.records.Workload`.

:func:`build_workload` turns what the user typed (model, data, image size)
into a checked Workload in the parent, before any trial, so bad input fails
fast with one line. :mod:`.models` resolves model references, :mod:`.folders`
checks ImageFolder directories, :mod:`.data` holds the synthetic JPEGs, the
transform and the endless sampler.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from autotune.errors import StorageError
from autotune.files import check_writable
from autotune.records import Workload
from autotune.units import format_bytes
from autotune.workloads.data import SYNTHETIC_CLASSES, SYNTHETIC_JPEG_BYTES, default_synthetic_images, ensure_synthetic, synthetic_dir
from autotune.workloads.folders import check_data_path, check_image_folder
from autotune.workloads.models import check_factory, check_model_name, named_batch_norm

__all__ = ["build_workload", "check_synthetic_target", "write_synthetic"]


def build_workload(
    *,
    model: str,
    image_size: int,
    data: Path | None,
    device: str,
    cache_dir: Path | None = None,
    synthetic_images: int | None = None,
    lr: float = 1e-3,
    warn: Callable[[str], None] | None = None,
    write_data: bool = True,
    tell: Callable[[str], None] | None = None,
) -> Workload:
    """Check the model and data and return a ready Workload.

    Synthetic data is generated here (once) so that no trial pays for it;
    with ``write_data=False`` the caller does it later, with
    :func:`write_synthetic` (a search, once the stored study's signature has
    accepted the workload). ``warn`` is given what looks wrong but is
    allowed (one class folder, split folders such as train/ and val/ taken as
    classes) and the generation of many JPEGs. ``synthetic_images`` None:
    the device's default (:func:`~autotune.workloads.data.default_synthetic_images`). ``tell`` is given what a
    ``--data`` folder holds: its images and classes, and the files ImageFolder skips.

    Raises:
        WorkloadError: Unknown model, unimportable factory, missing or empty data.
    """
    sys_path = (os.getcwd(),)
    if synthetic_images is None:
        synthetic_images = default_synthetic_images(device)
    # The numbers are checked before any data is generated.
    Workload(model=model, image_size=image_size, device=device, lr=lr, synthetic_images=synthetic_images)
    if data is not None:
        check_data_path(data)  # before the model's name, whose check imports torchvision; the folder's listing after it
    check_model_name(model)
    check_factory(model, sys_path)
    if data is not None:
        folder = check_image_folder(data)
        if tell is not None:
            tell(folder.summary)  # what the trials will read: the images, the classes, the files ImageFolder skips
        if folder.warning and warn is not None:
            warn(f"warning: {folder.warning}")
        num_classes, images = folder.classes, folder.images
        data_text: str | None = str(data.resolve())
    else:
        num_classes, images = SYNTHETIC_CLASSES, synthetic_images
        data_text = None
    workload = Workload(
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
        batch_norm=named_batch_norm(model, num_classes=num_classes, image_size=image_size),
    )
    if write_data:
        write_synthetic(workload, warn)
    return workload


def check_synthetic_target(workload: Workload) -> None:
    """Refuse a ``--cache-dir`` where the synthetic JPEGs of a workload without data are still to be written and cannot
    be; nothing for ``--data``, a Task, or JPEGs written before.

    Raises:
        StorageError: The cache directory cannot be made or written.
    """
    if workload.data is not None or workload.task is not None or not workload.synthetic_images:
        return
    target = synthetic_dir(workload.cache_dir, workload.synthetic_images)
    if target.is_dir():
        return
    if workload.cache_dir is not None:
        check_writable(target.parent, "--cache-dir")
        return
    chosen = next((f" (${name})" for name in ("AUTOTUNE_CACHE", "XDG_CACHE_HOME") if os.environ.get(name)), "")
    try:  # the default cache (under HOME, or where a variable says): a flag the user never typed is no way to name it
        check_writable(target.parent, f"the synthetic JPEGs' default cache{chosen}")
    except StorageError as exc:
        raise StorageError(f"{exc}; pass --cache-dir DIR to write them elsewhere, or --data DIR for your own images") from None


def write_synthetic(workload: Workload, warn: Callable[[str], None] | None = None, stop: Callable[[], bool] | None = None) -> None:
    """Generate the synthetic JPEGs of a workload without data, once; nothing for ``--data`` or a Task.

    Args:
        workload: What :func:`build_workload` returned.
        warn: Told first when the JPEGs are not there yet (minutes for a large count).
        stop: Whether the caller was asked to stop meanwhile (a search's remembered stop signal).

    Raises:
        StorageError: The cache directory cannot be made or written (before the line saying the JPEGs are written).
        WorkloadError: Writing them failed.
    """
    if workload.data is not None or workload.task is not None:
        return
    count = workload.synthetic_images
    target = synthetic_dir(workload.cache_dir, count)
    check_synthetic_target(workload)  # `autotune trial --cache-dir /proc/x` said "writing 2000 synthetic JPEGs to ..." first
    if warn is not None and not (target / ".complete").exists():  # minutes for a large count: say what runs
        warn(f"writing {count} synthetic JPEGs to {target} (about {format_bytes(count * SYNTHETIC_JPEG_BYTES)}, once)")
    ensure_synthetic(workload.cache_dir, count, stop)
