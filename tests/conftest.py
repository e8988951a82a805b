"""Shared test fixtures."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# OpenMP threads that wait for work sleep instead of spinning, in this process and every process it starts (set before
# any test imports torch; xdist's workers inherit it from the controller). The suite runs three test files at once on
# two cores, each starting trials and scripts whose torch threads would spin on the cores the others need: the quick
# benchmark run used 95 s of CPU spinning (the default policy) and 62 s sleeping, on 2026-12-06. Nothing the tests
# assert depends on it; a user's search keeps OpenMP's defaults.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if TYPE_CHECKING:
    from autotune.records import Workload

#: When this test process began: only trial directories made since are its tests'.
_BEGAN = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the trial directories of the searches the tests killed with ``kill -9``: made for that, they stay for a
    later search to sweep an hour on (:func:`autotune.runner.launch.remove_stale_trial_dirs`), and a CI run left two;
    and the /dev/shm files of loader workers the tests killed (a CI run left one). A live process's (another
    pytest-xdist process's) are left alone."""
    from autotune.files import maker_is_gone
    from autotune.runner.launch import PREFIX

    for left in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        try:
            made = left.stat().st_mtime
        except OSError:
            continue
        if made >= _BEGAN and maker_is_gone(left.name[len(PREFIX):].partition("-")[0]):
            shutil.rmtree(left, ignore_errors=True)
    # Likewise the file a loader worker had made in /dev/shm for a batch and not yet unlinked when a test killed it
    # (kill -9 of a script or a worker): named for a process that is gone, nobody can open it any more.
    for left in Path("/dev/shm").glob("torch_*_*_*"):
        try:
            made = left.stat().st_mtime
        except OSError:
            continue
        if made >= _BEGAN and maker_is_gone(left.name.split("_")[1]):
            left.unlink(missing_ok=True)


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


def closed_connection() -> Any:
    """A multiprocessing connection whose other end is closed: reading it raises EOFError in multiprocessing's code, as
    a loader worker that ended while it handed a batch over leaves the DataLoader's queue."""
    import multiprocessing

    reader, writer = multiprocessing.Pipe(duplex=False)
    writer.close()
    return reader


@pytest.fixture
def broken_hand_over() -> BaseException:
    """The EOFError a real DataLoader raises when a worker ends while it hands a batch over in shared memory: its queue's
    connection closes before PyTorch sees the worker gone (here the queue reads a closed connection, the worker alive)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2, num_workers=1)
    batches = iter(loader)
    reader = closed_connection()
    batches._data_queue.get = lambda timeout=None: reader.recv()  # type: ignore[attr-defined]
    try:
        next(batches)
    except EOFError as exc:
        return exc
    finally:
        batches._shutdown_workers()  # type: ignore[attr-defined]
    raise AssertionError("the DataLoader did not raise the EOFError of its queue")


#: A test running longer than this fails with a traceback of where it was, and the run goes on (the longest ones take
#: about 115 s on the 2-core CI machine, beside two other test files in the other pytest-xdist processes): one hung test
#: must not hold CI past its 15 minutes with nothing said. A test marked ``time_limit(S)`` gets ``S`` seconds when that
#: is longer (a whole benchmark run, whose time grows with the machine's load).
TEST_TIMEOUT_S = float(os.environ.get("AUTOTUNE_TEST_TIMEOUT_S", "300"))


@pytest.fixture(autouse=True)
def _time_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test at its time limit by SIGALRM (a process timer: forked trial servers do not inherit it)."""
    marker = request.node.get_closest_marker("time_limit")
    limit = max(TEST_TIMEOUT_S, float(marker.args[0])) if marker else TEST_TIMEOUT_S

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"the test ran over {limit:g} s ({'its time_limit mark' if limit > TEST_TIMEOUT_S else 'AUTOTUNE_TEST_TIMEOUT_S'})")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


#: A 1x1 PNG, marked as the report's are (``Software: autotune report``).
TINY_PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAAGHRFWHRTb2Z0d2FyZQBhdXRvdHVuZSByZXBvcnQGMMKgAAAADUlEQVR42mNk"
                            "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


@pytest.fixture(autouse=True)
def _figures_built_not_rasterized(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside test_report.py, a search in this process builds every figure of its report from its own
    records (so the plot code meets every kind of search the tests make) but does not rasterize them:
    drawing seven PNGs takes about 2 s per search on a 2-core machine, and the tests write over 50 reports
    in this process. test_report.py, and every ``autotune search`` run in a child process, draw them for real."""
    if request.module.__name__ == "test_report":
        return
    try:
        from autotune.output import plots
    except ImportError:  # no matplotlib: the reports are text-only anyway
        return
    monkeypatch.setattr(plots, "png", lambda fig: TINY_PNG)


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
