"""The synthetic JPEGs written by worker processes: the same files as one process writes, and the generation's
guarantees kept (no copy and no worker left on a full disk, a stop or a killed worker). No timing assertions."""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from pathlib import Path

import psutil
import pytest

from autotune.errors import WorkloadError
from autotune.workloads.data import SYNTHETIC_JPEG, ImageMaker, _draw_image, ensure_synthetic, generate_image_folder, write_image
from autotune.workloads.file_workers import FILES_PER_PROCESS, worker_count, writer_reference


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def full_disk(spec: tuple[int, ...], path: Path) -> None:
    """A worker's writer that meets a full disk at the 5th file."""
    if path.name == "img_000005.jpg":
        raise OSError(errno.ENOSPC, "No space left on device")
    path.write_bytes(b"x")


def killed(spec: tuple[int, ...], path: Path) -> None:
    """A worker's writer killed at the 3rd file (the OOM killer)."""
    if path.name == "img_000003.jpg":
        os.kill(os.getpid(), signal.SIGKILL)
    path.write_bytes(b"x")


def slow(spec: tuple[int, ...], path: Path) -> None:
    """A worker's writer slow enough for a stop to arrive meanwhile."""
    time.sleep(0.05)
    path.write_bytes(b"x")


def _draw(rng: random.Random) -> tuple[int, ...]:
    return (rng.getrandbits(8),)


def _no_workers_left() -> bool:
    """No file worker of this process is alive (other children, such as a trial server an earlier test of this
    pytest process started, are not ours to count)."""
    workers = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "autotune.workloads.file_workers" in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.Error:  # ended meanwhile
            pass
    return not workers


def test_worker_processes_write_the_same_bytes_as_one_process(tmp_path) -> None:
    """40 JPEGs by 2 processes, by 1, and by the one function that drew and wrote each file in turn (how the
    synthetic-v1 sets were made): the same files, byte for byte, so an existing cache stays valid."""
    two = generate_image_folder(tmp_path / "two", 40, SYNTHETIC_JPEG, seed=1234, note="n", processes=2)
    one = generate_image_folder(tmp_path / "one", 40, SYNTHETIC_JPEG, seed=1234, note="n", processes=1)
    old = generate_image_folder(tmp_path / "old", 40, lambda rng, path: write_image(_draw_image(rng), path), seed=1234, note="n")
    assert len(_files(two)) == 41 and _files(two) == _files(one) == _files(old)
    assert _files(ensure_synthetic(tmp_path / "cache", 40, processes=2)) == {**_files(one), ".complete": b"40 synthetic JPEGs, version 1\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "old", "one", "two"] and _no_workers_left()


def test_how_many_processes_write() -> None:
    assert worker_count(64, cores=16) == 1  # the tests' 64 JPEGs: no worker pays for its start
    assert worker_count(2000, cores=2) == 2 and worker_count(16384, cores=16) == 16
    assert worker_count(3 * FILES_PER_PROCESS, cores=16) == 3 and worker_count(10**6, cores=1) == 1
    assert writer_reference(write_image) == "autotune.workloads.data:write_image"
    assert writer_reference(lambda spec, path: None) is None  # written in this process


def test_a_full_disk_in_a_worker_is_one_line_and_leaves_no_copy(tmp_path) -> None:
    with pytest.raises(WorkloadError, match=r"^cannot write synthetic data under .*: No space left on device; "
                                            r"pass another --cache-dir, or free space in this one$"):
        generate_image_folder(tmp_path / "synthetic", 40, ImageMaker(_draw, full_disk), seed=0, note="t", processes=2)
    assert list(tmp_path.iterdir()) == [] and _no_workers_left()


def test_a_failed_write_of_the_synthetic_data_names_where_its_directory_came_from(tmp_path, monkeypatch) -> None:
    """Every failed write said "pass --cache-dir DIR to write it elsewhere", to a user who had passed it, and where
    $AUTOTUNE_CACHE had chosen the directory."""
    from autotune.workloads.data import elsewhere

    monkeypatch.delenv("AUTOTUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert elsewhere(tmp_path / "xdg" / "autotune" / "synthetic-64") == (
        f"pass --cache-dir DIR to write it elsewhere (the default is {tmp_path / 'xdg' / 'autotune'})")
    assert elsewhere(tmp_path / "mine" / "synthetic-64") == "pass another --cache-dir, or free space in this one"
    assert elsewhere(tmp_path / "mine" / "synthetic-64", full=False) == "pass another --cache-dir"  # under a file: no space to free
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "env"))
    assert elsewhere(tmp_path / "env" / "synthetic-64") == (
        f"$AUTOTUNE_CACHE chose {tmp_path / 'env'}: pass --cache-dir DIR (or set AUTOTUNE_CACHE) to write it elsewhere")


def test_a_killed_worker_is_one_line_and_leaves_no_copy(tmp_path) -> None:
    with pytest.raises(WorkloadError, match=r"^a process writing synthetic files was killed by signal 9$"):
        generate_image_folder(tmp_path / "synthetic", 40, ImageMaker(_draw, killed), seed=0, note="t", processes=2)
    assert list(tmp_path.iterdir()) == [] and _no_workers_left()


def test_a_stop_ends_the_workers_and_leaves_no_copy(tmp_path) -> None:
    """The search's remembered stop (or a Ctrl-C) while workers write: they are killed, the copy removed."""
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        generate_image_folder(tmp_path / "synthetic", 400, ImageMaker(_draw, slow), seed=0, note="t", processes=2,
                              stop=lambda: time.monotonic() - started > 1.0)
    assert list(tmp_path.iterdir()) == [] and _no_workers_left()
