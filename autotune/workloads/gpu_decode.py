"""GPU JPEG decoding for the classifier's image folders (``decode=gpu``).

The loader's workers only read file bytes; the training process moves the
bytes to the GPU, where ``torchvision.io.decode_jpeg(device="cuda")`` decodes
the batch and the augmentation runs (random resized crop, flip, uint8 to
float, normalize). A file that is not a JPEG is decoded on the CPU instead,
and a note says so once.
"""

from __future__ import annotations

import sys
from typing import Any

from autotune.workloads.data import IMAGENET_MEAN, IMAGENET_STD, BadImage, check_regular_file, open_rgb


def read_bytes(path: str) -> Any:
    """The raw bytes of one image file as a uint8 tensor, read in plain Python.

    Not ``torchvision.io.read_file``: the loader's workers are forked from a
    process that has started CUDA, and there that op never returned (torch
    2.11 and torchvision 0.26 on an H200, ``benchmarks/device_check.sh``;
    docs/benchmarks.md): every ``decode=gpu`` trial with workers timed out.

    Raises:
        BadImage: Not a regular file, or unreadable, naming it.
    """
    import torch

    try:
        check_regular_file(path)
        with open(path, "rb") as file:
            data = bytearray(file.read())
    except OSError as exc:  # as the CPU pipeline's loader names it (a file removed or unreadable meanwhile)
        raise BadImage(f"{path}: cannot read ({exc.strerror or exc})") from None
    return torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def read_named(path: str) -> tuple[Any, str]:
    """:func:`read_bytes` with the file's path: a file the decoder refuses is named in the training process."""
    return read_bytes(path), path


def byte_folder(path: str) -> Any:
    """An ``ImageFolder`` whose items are ``((file bytes, path), label)``: no decoding in the loader."""
    from torchvision.datasets import ImageFolder

    return ImageFolder(path, loader=read_named)


def collate_bytes(items: list[tuple[tuple[Any, str], int]]) -> tuple[list[Any], Any, list[str]]:
    """A batch of files of different lengths: the byte tensors as a list, the labels as one tensor, the paths."""
    import torch

    files = [file for file, _ in items]
    return [data for data, _ in files], torch.tensor([label for _, label in items], dtype=torch.long), [path for _, path in files]


def decode_on_cpu(data: Any, path: str = "a file of the batch") -> Any:
    """One file's bytes as a 3 x H x W uint8 tensor, on the CPU: torchvision's decoder (PNG, WebP, GIF; a 16-bit PNG
    scaled to 8 bits as the CPU pipeline's loader scales it), else PIL, as that loader decodes (BMP, TIFF, PPM:
    torchvision's decoder refuses those, which ImageFolder reads).

    Raises:
        BadImage: Neither decodes it (empty, truncated, not an image), naming ``path``.
    """
    import io

    import torch
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms.v2.functional import pil_to_tensor

    try:
        decoded = decode_image(data, mode=ImageReadMode.RGB)
        if decoded.dtype == torch.uint16:  # a 16-bit PNG: to 8 bits as the CPU loader scales it (value / 256)
            return (decoded >> 8).to(torch.uint8)
        if decoded.dtype == torch.uint8:
            return decoded
    except (RuntimeError, ValueError):
        pass
    return pil_to_tensor(open_rgb(io.BytesIO(data.numpy().tobytes()), path))  # PIL, as the CPU pipeline reads it


class GpuDecoder:
    """Decode and augment a batch of JPEG bytes on the CUDA device."""

    def __init__(self, image_size: int, device: Any) -> None:
        import torch
        from torchvision.transforms import v2

        self.device = torch.device(device)
        self.crop = v2.Compose([v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip()])
        self.mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1)
        self.noted = False

    def decode(self, files: list[Any], paths: list[str] | None = None) -> list[Any]:
        """Each file as a 3 x H x W uint8 tensor on the device (``paths``: the files', to name one neither decoder reads)."""
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            return list(decode_jpeg(files, mode=ImageReadMode.RGB, device=self.device))
        except (RuntimeError, ValueError):  # a file that is not a JPEG: decode one by one, on the CPU where needed
            images = []
            for k, data in enumerate(files):
                try:
                    images.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device))
                except (RuntimeError, ValueError):
                    if not self.noted:
                        print("note: decode=gpu: a file is not a JPEG; such files are decoded on the CPU", file=sys.stderr)
                        self.noted = True
                    images.append(decode_on_cpu(data, paths[k] if paths else f"file {k} of a batch").to(self.device))
            return images

    def __call__(self, batch: tuple[Any, ...], *, channels_last: bool = False) -> tuple[Any, Any]:
        """``(images, labels)`` on the device: decoded, cropped, flipped, normalized float32 (``batch``: files, labels
        and, from :func:`collate_bytes`, their paths).

        Raises:
            BadImage: A file neither decoder reads, named.
        """
        import torch

        files, labels = batch[0], batch[1]
        images = torch.stack([self.crop(image) for image in self.decode(files, batch[2] if len(batch) > 2 else None)])
        images = (images.float().div_(255.0) - self.mean) / self.std
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(self.device, non_blocking=bool(labels.is_pinned()))
