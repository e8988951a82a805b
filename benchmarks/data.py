"""Small synthetic JPEGs for the compute-heavy benchmark workload.

``autotune.data.ensure_synthetic`` makes ImageNet-sized files (about
500x375), which keeps the loader busy. The compute-heavy workload wants the
opposite: small source images (about 160x120) that decode cheaply, so the
model, not the loader, is the bottleneck. Same layout (10 class folders),
same kind of content (a smooth colour field with fine noise), written by
autotune's own atomic generator.
"""

from __future__ import annotations

import random
from pathlib import Path

from autotune.workloads.data import default_cache_dir, generate_image_folder
from autotune.workloads.folders import check_image_folder

_VERSION = 1


def small_synthetic_dir(cache_dir: str | Path | None, n_images: int, width: int = 160, height: int = 120) -> Path:
    """Where the small synthetic set lives (not created)."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return root / f"small-synthetic-v{_VERSION}-{width}x{height}-{n_images}"


def _make_small_image(rng: random.Random, path: Path, width: int, height: int) -> None:
    import numpy as np
    from PIL import Image

    w = max(8, int(width * rng.uniform(0.9, 1.1)))
    h = max(8, int(height * rng.uniform(0.9, 1.1)))
    gen = np.random.default_rng(rng.getrandbits(32))
    coarse = gen.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((w, h), Image.BICUBIC)
    pixels = np.asarray(image, dtype=np.int16) + gen.integers(-12, 13, size=(h, w, 3), dtype=np.int16)
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, format="JPEG", quality=90)


def ensure_small_synthetic(
    cache_dir: str | Path | None, n_images: int = 2000, width: int = 160, height: int = 120
) -> Path:
    """Generate (once) an ImageFolder of small JPEGs; return its directory.

    Args:
        cache_dir: Parent directory (None: autotune's default cache).
        n_images: Number of files, spread over 10 class folders.
        width: Approximate image width (each file varies by +-10 %).
        height: Approximate image height.

    Returns:
        The ImageFolder root, ready for ``--data``.
    """
    target = generate_image_folder(
        small_synthetic_dir(cache_dir, n_images, width, height),
        n_images,
        lambda rng, path: _make_small_image(rng, path, width, height),
        seed=4321,
        note=f"{n_images} small synthetic JPEGs ({width}x{height})",
    )
    check_image_folder(target)
    return target
