"""Training data: ImageFolder directories (their checks in :mod:`.folders`) and a synthetic JPEG stand-in.

Without ``--data`` autotune generates, once, a synthetic ImageFolder of real
JPEG files of ImageNet-like size (about 500x375, quality 90) into a cache
directory, so the DataLoader does the same decode and augmentation work a
real ImageNet pipeline does. The directory is reused by later runs.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import WorkloadError
from autotune.files import dangling, maker_is_gone, nearest_existing
from autotune.workloads.file_workers import worker_count, write_in_processes, writer_reference

if TYPE_CHECKING:  # pragma: no cover
    from torch.utils.data import Dataset

    from autotune.records import Workload

SYNTHETIC_CLASSES = 10
#: Synthetic JPEGs without --data on a CPU (the default when the device is a CPU).
SYNTHETIC_IMAGES_CPU = 2000
#: ... and on a CUDA device, which trains an epoch of 2000 in under a second (resnet50 at 224 px on an H200: 4,652
#: samples/s computing alone): there an epoch that small held the loader's queue (workers x prefetch x batch) to a few
#: workers. 2**14 holds batch 1024 with 8 workers x prefetch 2 (docs/benchmarks.md, "The first GPU run").
SYNTHETIC_IMAGES_CUDA = 2**14
#: Bytes of one synthetic JPEG on disk, about (``du -sh`` of the 64-image set: 3.4 MiB).
SYNTHETIC_JPEG_BYTES = 53 * 1024
_SYNTHETIC_VERSION = 1
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def elsewhere(target: Path, full: bool = True) -> str:
    """What a failed write of the synthetic data under ``target`` suggests, by where its cache directory came from (it
    defaults to ~/.cache/autotune: an unwritable HOME, a full disk). A ``--cache-dir`` the user gave was told to be
    passed; to free space in it only where ``full`` (not for a path below a file)."""
    chosen = default_cache_dir()
    if chosen not in (target, *target.parents):
        return "pass another --cache-dir, or free space in this one" if full else "pass another --cache-dir"
    if os.environ.get("AUTOTUNE_CACHE"):
        return f"$AUTOTUNE_CACHE chose {chosen}: pass --cache-dir DIR (or set AUTOTUNE_CACHE) to write it elsewhere"
    return f"pass --cache-dir DIR to write it elsewhere (the default is {chosen})"


def default_cache_dir() -> Path:
    """``$AUTOTUNE_CACHE``, else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``."""
    env = os.environ.get("AUTOTUNE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "autotune"


def default_synthetic_images(device: str) -> int:
    """The synthetic JPEGs a workload without data gets on ``device`` (``cpu``, ``cuda``, ``cuda:K``) when
    ``--synthetic-images`` is not given."""
    return SYNTHETIC_IMAGES_CUDA if device.startswith("cuda") else SYNTHETIC_IMAGES_CPU


def synthetic_dir(cache_dir: str | Path | None, n_images: int) -> Path:
    """Where the synthetic dataset of ``n_images`` files lives (not created)."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return root / f"synthetic-v{_SYNTHETIC_VERSION}-{n_images}"


def _draw_image(rng: random.Random) -> tuple[int, int, int]:
    """Width, height and pixel seed of one synthetic JPEG, drawn in file order from the generator of the whole set."""
    return rng.randint(400, 600), rng.randint(300, 450), rng.getrandbits(32)  # width, height, pixel seed


def write_image(spec: tuple[int, ...], path: Path) -> None:
    """Write one synthetic JPEG of the parameters :func:`_draw_image` drew (a worker process imports it by name)."""
    import numpy as np
    from PIL import Image

    width, height, seed = spec
    gen = np.random.default_rng(seed)
    # A smooth colour field with fine noise on top: decodes like a photo,
    # neither a flat image (too cheap) nor pure noise (too expensive).
    coarse = gen.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(image, dtype=np.int16) + gen.integers(-12, 13, size=(height, width, 3), dtype=np.int16)
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, format="JPEG", quality=90)


@dataclass(frozen=True)
class ImageMaker:
    """Each file of a set made in two steps, so that worker processes can share the writing.

    Attributes:
        draw: One file's parameters (a few integers) from the set's generator, drawn in file order in the calling
            process: the files do not depend on the number of processes.
        write: Writes one file from its parameters; a module-level function, imported by name in a worker process
            (a lambda or closure is called in the calling process only).
    """

    draw: Callable[[random.Random], tuple[int, ...]]
    write: Callable[[tuple[int, ...], Path], None]


#: The synthetic JPEGs (the same bytes as when one function drew and wrote each file in turn: synthetic-v1 stands).
SYNTHETIC_JPEG = ImageMaker(draw=_draw_image, write=write_image)


def generate_image_folder(
    target: Path, n_images: int, make_image: Callable[[random.Random, Path], None] | ImageMaker, *, seed: int, note: str,
    stop: Callable[[], bool] | None = None, processes: int | None = None,
) -> Path:
    """Write ``n_images`` files into a 10-class ImageFolder at ``target``, once.

    The files are written to a temporary directory and renamed into place, so
    an interrupted or concurrent generation never leaves a half dataset. An
    :class:`ImageMaker` whose ``write`` a worker process can import writes
    them in worker processes over the usable cores (:mod:`.file_workers`),
    the same files as one process writes.

    Args:
        target: The ImageFolder root.
        n_images: Files to write, spread over the classes.
        make_image: Writes one image file from the shared random generator (in this process), or an
            :class:`ImageMaker`.
        seed: Seed of that generator (the same seed gives the same files).
        note: Text of the ``.complete`` marker.
        stop: Whether the caller was asked to stop meanwhile, looked at before each file (with worker processes:
            every 50 ms): a search's stop signal raises KeyboardInterrupt, which a garbage-collection callback
            running at that moment swallows ("Exception ignored in ..."), while the stop stays remembered.
        processes: Processes that write an ImageMaker's files (None: one per usable core, each with at least
            :data:`~autotune.workloads.file_workers.FILES_PER_PROCESS` files; 1: this process alone).

    Raises:
        WorkloadError: The parent directory is not writable, or a worker process failed.
        KeyboardInterrupt: ``stop`` said so (no copy is left, no worker process either).
    """
    if (target / ".complete").exists():
        return target
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    blocking = nearest_existing(target.parent)
    if not blocking.is_dir():
        raise WorkloadError(f"cannot write synthetic data under {target.parent}: {blocking} is not a directory; {elsewhere(target, full=False)}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_copies(target)
        shutil.rmtree(tmp, ignore_errors=True)
        for cls in range(SYNTHETIC_CLASSES):
            (tmp / f"class_{cls:02d}").mkdir(parents=True)
        _write_files(tmp, n_images, make_image, random.Random(seed), stop, processes)
        (tmp / ".complete").write_text(note + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            # Someone else finished first (or a stale incomplete dir is there).
            if (target / ".complete").exists():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    except BaseException as exc:  # Ctrl-C, a full disk: leave no half copy behind
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)  # else (a permission, a read-only disk) freeing space is no fix
            raise WorkloadError(f"cannot write synthetic data under {target.parent}: {exc.strerror or exc}; {elsewhere(target, full)}") from None
        raise
    return target


def _write_files(tmp: Path, n_images: int, make_image: Callable[[random.Random, Path], None] | ImageMaker,
                 rng: random.Random, stop: Callable[[], bool] | None, processes: int | None) -> None:
    """Write the files of :func:`generate_image_folder` into ``tmp``: in worker processes where they pay, else here."""
    paths = [tmp / f"class_{i % SYNTHETIC_CLASSES:02d}" / f"img_{i:06d}.jpg" for i in range(n_images)]
    if isinstance(make_image, ImageMaker):  # drawn in file order, always: the bytes do not depend on the process count
        jobs = [(path, make_image.draw(rng)) for path in paths]
        count = worker_count(n_images) if processes is None else max(1, processes)
        if count > 1 and writer_reference(make_image.write) is not None:
            write_in_processes(make_image.write, jobs, count, stop)
            return
        writes = [partial(make_image.write, spec, path) for path, spec in jobs]
    else:  # a plain function draws from the generator as it writes
        writes = [partial(make_image, rng, path) for path in paths]
    for write in writes:
        if stop is not None and stop():
            raise KeyboardInterrupt
        write()


def _remove_dead_copies(target: Path) -> None:
    """Remove the temporary copies of processes that died while generating (``kill -9``), of any size
    (``synthetic-v1-500`` sweeps ``.synthetic-v1-*.tmp-PID`` copies)."""
    family = target.name.rpartition("-")[0]
    for stale in target.parent.glob(f".{family}-*.tmp-*" if family else f".{target.name}.tmp-*"):
        if maker_is_gone(stale.name.rpartition("-")[2]):
            shutil.rmtree(stale, ignore_errors=True)


def ensure_synthetic(cache_dir: str | Path | None = None, n_images: int = 2000, stop: Callable[[], bool] | None = None,
                     processes: int | None = None) -> Path:
    """Generate the synthetic ImageFolder once; return its directory (``stop``, ``processes``: as for
    :func:`generate_image_folder`).

    Raises:
        WorkloadError: The cache directory is not writable.
    """
    return generate_image_folder(
        synthetic_dir(cache_dir, n_images),
        n_images,
        SYNTHETIC_JPEG,
        seed=1234,
        note=f"{n_images} synthetic JPEGs, version {_SYNTHETIC_VERSION}",
        stop=stop,
        processes=processes,
    )


def train_transform(image_size: int) -> Any:
    """The ImageNet-style training augmentation, done on the CPU by the loader."""
    import torch
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(image_size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


class BadData(WorkloadError):
    """An item of the data cannot be read: every setup that reaches it fails the same way (status ``bad_data``)."""


class BadImage(BadData):
    """An image file of the data cannot be decoded (truncated, corrupt, not an image)."""


def check_regular_file(path: str) -> None:
    """Refuse a FIFO, socket or device named like an image: open() of a FIFO named *.jpg waits for a writer (the
    trial timed out).

    Raises:
        BadImage: ``path: not a regular file ...``.
        OSError: ``path`` cannot be read at all.
    """
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise BadImage(f"{path}: not a regular file (a FIFO, socket or device): it cannot be read as an image")


def rgb(image: Any) -> Any:
    """A PIL ``image`` as RGB, grayscale wider than 8 bits scaled to them: 16-bit integers (PIL's ``I;16`` modes, a
    PNG's ``I``) and 32-bit ones holding values above 255 (``I``: a microscope's TIFF) as value / 256, so 0..65535
    spans 0..255 and wider values clip; 32-bit floats (``F``) whose values lie within 0..1 as value x 255. PIL's own
    conversion, which torchvision's ImageFolder loader uses, clips every value above 255 (a 16-bit or 32-bit integer
    scan trained as a white image) and truncates floats (a 0..1 float TIFF as a black one); 32-bit images of 8-bit
    values (0..255, integers or floats) read as they are."""
    wide = image.mode == "I" and (image.format == "PNG" or image.getextrema()[1] > 255)  # Pillow < 10.3 opens 16-bit PNGs as I
    if image.mode.startswith("I;16") or wide:
        image = image.convert("I").point(lambda value: value * (1 / 256))
    elif image.mode == "F" and image.getextrema()[1] <= 1.0:
        image = image.point(lambda value: value * 255)
    return image.convert("RGB")


def open_rgb(source: Any, path: str) -> Any:
    """``source`` (a path or a binary file object) opened by PIL as RGB (:func:`rgb`), as ImageFolder's default loader
    opens it; the CPU pipeline and the GPU decoder's CPU fallback both read through here, so a bad file is named alike.

    Raises:
        BadImage: ``path: cannot decode (...)`` (empty, truncated, not an image) or ``path: too large to decode``.
    """
    from PIL import Image

    try:
        with Image.open(source) as image:
            return rgb(image)
    except Image.DecompressionBombError as exc:  # not an OSError: it stopped a trial as a setup's error, unnamed
        raise BadImage(f"{path}: too large to decode ({exc})") from None
    except (OSError, SyntaxError, ValueError) as exc:  # what PIL raises for a bad file
        raise BadImage(f"{path}: cannot decode ({type(exc).__name__}: {exc})") from None


#: What :func:`load_image` says of a file that is gone (listed, then removed before it was read): a search advises putting it back.
MISSING = "cannot read (No such file or directory)"


def load_image(path: str) -> Any:
    """Open one image file as RGB (:func:`open_rgb`), naming the file on failure.

    Raises:
        BadImage: ``path: cannot decode (...)`` (PIL's), ``path: cannot read (...)`` (no permission, an I/O error: the
            OS's), a dangling link, not a regular file.
    """
    try:
        check_regular_file(path)
        with open(path, "rb") as fh:
            return open_rgb(fh, path)
    except FileNotFoundError:  # a link whose target is gone reads as a missing file
        gone = dangling(path) if os.path.islink(path) else MISSING
        raise BadImage(f"{path}: {gone}") from None
    except (OSError, ValueError) as exc:  # no permission, an I/O error, a NUL in the name: open() fails before PIL sees it
        said = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        raise BadImage(f"{path}: cannot read ({said})") from None


def same_count(dataset: Any, workload: Workload, world_size: int = 1) -> Any:
    """``dataset``, read from the classifier's image folder, once its count is what the search (or trial) began with
    (``workload.images``: the whole folder's, or one rank's share of ``world_size``); a Task's data is its own.

    Raises:
        BadData: Files were removed or added while the search ran: its trials would measure other data than it says,
            and its study (made for the count) could not go on.
    """
    expected = workload.images
    # The search's workload counts one rank's share, `autotune trial`'s the whole folder.
    if workload.task is None and expected is not None and expected not in (len(dataset), max(1, len(dataset) // world_size)):
        began = expected if world_size == 1 else f"{expected} (a rank's share of {expected * world_size} or so)"
        raise BadData(f"{workload.data or 'the synthetic JPEGs'}: {len(dataset)} images now, {began} at the start: files were "
                      "removed or added while it ran; put them back")
    return dataset


def image_folder(path: str | Path, image_size: int) -> Dataset[Any]:
    """An ``ImageFolder`` with the training transform; a file that cannot be decoded raises :class:`BadImage`."""
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(path), transform=train_transform(image_size), loader=load_image)


#: Items up to which the endless sampler permutes the whole dataset (8 MiB of indices, about 0.1 s to draw).
PERMUTED_ITEMS = 1 << 20
#: Indices drawn at a time from a larger dataset.
DRAWN_ITEMS = 1 << 16


class InfiniteSampler:
    """Indices from successive random permutations, forever.

    A measured trial must not end its epoch every few steps: each new epoch
    restarts the loader pipeline, a stall a real epoch of a million images
    does not have. A dataset of more than :data:`PERMUTED_ITEMS` items is read
    at indices drawn uniformly at random, :data:`DRAWN_ITEMS` at a time: a
    permutation of all of them (about 48 GB at a billion items: 8 bytes per
    index in the tensor, 40 per Python integer in its list, measured at 10**7)
    would cost a trial, which reads a few thousand batches, its memory
    (``oom``) and start-up, a cost a real epoch spreads over all its steps.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        if size < 1:
            raise WorkloadError("the dataset is empty")
        self.size = size
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        import torch

        gen = torch.Generator()
        gen.manual_seed(self.seed)
        while True:
            if self.size > PERMUTED_ITEMS:
                yield from torch.randint(self.size, (DRAWN_ITEMS,), generator=gen).tolist()
            else:
                yield from torch.randperm(self.size, generator=gen).tolist()

    def __len__(self) -> int:  # DataLoader asks; the sampler is endless
        return 2**62
