"""Software probe: versions of Python, torch, CUDA, cuDNN and friends.

Importing torch costs a second or more, so versions come from the installed
package metadata, and torch's CUDA version from its ``torch/version.py``
file read as text. Only with an NVIDIA driver present is torch imported, for
the cuDNN version (``torch.backends.cudnn.version()`` loads the library but
creates no CUDA context).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SoftwareInfo",
    "collect_software",
    "cudnn_version",
    "format_cudnn_version",
    "package_version",
    "torch_cuda_build",
]


@dataclass(frozen=True)
class SoftwareInfo:
    """Versions of the software the search runs on (None: not installed / not applicable).

    Attributes:
        python: The Python version, e.g. ``"3.11.9"``.
        torch: The installed torch distribution's version.
        torchvision: The installed torchvision version.
        cuda: The CUDA version torch was built with, only when an NVIDIA driver
            was seen (None on CPU builds and on machines without a driver).
        cudnn: The cuDNN version torch loads (``"9.24.0"``), only when ``cuda``
            is set.
        optuna: The installed optuna version.
        autotune: The installed autotune version.
        torch_cuda_build: The CUDA version torch was built with, whether or
            not a driver exists (None for CPU-only builds).
    """

    python: str
    torch: str | None
    torchvision: str | None
    cuda: str | None
    cudnn: str | None
    optuna: str | None
    autotune: str | None
    torch_cuda_build: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (the ``software`` object)."""
        return {
            "python": self.python,
            "torch": self.torch,
            "torchvision": self.torchvision,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "optuna": self.optuna,
            "autotune": self.autotune,
            "torch_cuda_build": self.torch_cuda_build,
        }


def package_version(name: str) -> str | None:
    """The installed version of a distribution, without importing it.

    Args:
        name: The distribution name, e.g. ``"torch"``.

    Returns:
        The version string, or None when it is not installed.
    """
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _constant_from_source(source: str, name: str) -> str | None:
    """The string assigned to a top-level ``name`` in Python source, else None."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
            return None
    return None


def autotune_version() -> str | None:
    """autotune's version: the installed distribution's, else the ``__version__`` of the ``autotune`` package on the
    import path (a checkout run in place, ``PYTHONPATH=.``, as on a GPU machine that installs nothing), read without
    importing it; None when neither is found."""
    return package_version("autotune") or _constant_in_package("autotune", "_version.py", "__version__")


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built with (``torch.version.cuda``), cheaply.

    Uses ``torch.version`` when torch is already imported, else parses the
    ``torch/version.py`` file without importing torch.

    Returns:
        E.g. ``"13.0"``; None for CPU-only builds or when torch is missing.
    """
    if "torch" in sys.modules:
        version = getattr(sys.modules["torch"], "version", None)
        cuda = getattr(version, "cuda", None)
        return str(cuda) if cuda else None
    return _constant_in_package("torch", "version.py", "cuda")


def _constant_in_package(package: str, file: str, name: str) -> str | None:
    """The string assigned to ``name`` in ``file`` of the package on the import path, read without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        return _constant_from_source((Path(spec.origin).parent / file).read_text(), name)
    except (OSError, SyntaxError, ValueError):
        return None


def format_cudnn_version(version: int) -> str:
    """Turn torch's integer cuDNN version into ``major.minor.patch``.

    cuDNN 9 encodes ``major*10000 + minor*100 + patch`` (92400 -> 9.24.0);
    earlier releases ``major*1000 + minor*100 + patch`` (8902 -> 8.9.2).

    Args:
        version: The integer from ``torch.backends.cudnn.version()``.

    Returns:
        The dotted version.
    """
    if version >= 90000:
        major, rest = divmod(version, 10000)
    else:
        major, rest = divmod(version, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def cudnn_version() -> str | None:
    """The cuDNN version torch loads (imports torch; creates no CUDA context).

    Returns:
        The dotted version, or None when torch has no cuDNN.
    """
    try:
        import torch.backends.cudnn

        version = torch.backends.cudnn.version()
    except Exception:  # torch missing or broken: report no cuDNN, never crash
        return None
    return format_cudnn_version(int(version)) if version else None


def collect_software(driver_loaded: bool) -> SoftwareInfo:
    """Collect the versions.

    Args:
        driver_loaded: Whether an NVIDIA driver answered (NVML initialised).
            Without one, ``cuda`` and ``cudnn`` are None and torch is not
            imported.

    Returns:
        The :class:`SoftwareInfo`.
    """
    build = torch_cuda_build()
    cuda = build if driver_loaded else None
    return SoftwareInfo(
        python=platform.python_version(),
        torch=package_version("torch"),
        torchvision=package_version("torchvision"),
        cuda=cuda,
        cudnn=cudnn_version() if cuda else None,
        optuna=package_version("optuna"),
        autotune=autotune_version(),
        torch_cuda_build=build,
    )
