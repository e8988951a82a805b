"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from autotune.records import Workload


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 64-image synthetic ImageFolder (10 classes), generated once per session."""
    from autotune.workloads.data import ensure_synthetic

    return ensure_synthetic(tmp_path_factory.mktemp("cache"), n_images=64)


@pytest.fixture(scope="session")
def cache_dir(synthetic_data: Path) -> Path:
    """The cache directory holding the 64-image synthetic dataset."""
    return synthetic_data.parent


@pytest.fixture(scope="session")
def tiny_workload(cache_dir: Path) -> Workload:
    """resnet18 at 32 px on the CPU over the 64 synthetic JPEGs."""
    from autotune.records import Workload

    return Workload(
        model="resnet18",
        image_size=32,
        device="cpu",
        num_classes=10,
        synthetic_images=64,
        cache_dir=str(cache_dir),
        sys_path=(str(Path(__file__).parent),),
    )


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``cuda`` on machines without a CUDA GPU."""
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
