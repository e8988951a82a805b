"""The files PyTorch leaves in /dev/shm when a loader worker's allocation there fails.

A worker hands a batch over through a file it creates in /dev/shm (``torch_<pid>_<random>_<counter>``) and unlinks as
soon as the main process holds it. Where the allocation fails (``unable to allocate shared memory(shm) for file
</torch_...>: No space left on device``), the name stays after every process is gone: a search in a small /dev/shm left
one per failed trial, the emitted script one per worker, and nothing removed them. A worker killed between creating
its file and unlinking it leaves one too.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psutil

from autotune.records import TrialResult
from probes.memory import SHM_PATH

#: PyTorch's name for a tensor's file in /dev/shm, whose number is the process that made it.
TORCH_FILE = re.compile(r"torch_(\d+)_\d+_\d+")


def may_have_left(result: TrialResult) -> bool:
    """Whether a trial that ended so may have left such files: one whose allocation in /dev/shm failed, or that ended
    otherwise (killed, interrupted, timed out: a worker ended between creating its file and unlinking it). Only then is
    /dev/shm looked at."""
    return result.status not in ("ok", "pruned")


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (one of another user's counts; a zombie does not: a loader worker whose parent
    ended is one until init reaps it, which some containers' init never does)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # there, but not ours to read
        return True


#: How long a process of the trial's own group, which its SIGKILL reached, may take to die (on a loaded machine it was
#: still running as the files were looked at, and its file stayed: a CI run) before its file is left.
ENDING_S = 30.0


def process_group(pid: int) -> int | None:
    """The process group of ``pid``; None once it is gone."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def remove_failed_allocations(since: float, directory: str | Path = SHM_PATH, group: int | None = None,
                              ending_s: float = ENDING_S) -> list[Path]:
    """Remove PyTorch's files in ``directory`` that a failed allocation left: named for a process that has ended,
    holding no block of memory (the allocation never took one, so no process can have read a tensor from it), and
    changed at or after ``since``.

    Args:
        since: When the run that failed began (``time.time()``); older files are not looked at.
        directory: Where the files are.
        group: The process group of the trial just killed: a file named for one of its processes still alive (killed,
            not yet dead) waits for it, up to ``ending_s``; any other live process's file is left at once.
        ending_s: How long to wait for those processes to end, in all.

    Returns:
        The files removed; none where the directory cannot be read.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    deadline = time.monotonic() + ending_s
    for entry in entries:
        named = TORCH_FILE.fullmatch(entry.name)
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # gone meanwhile
            continue
        if named is None or not entry.is_file(follow_symlinks=False) or info.st_blocks != 0 or info.st_mtime < since:
            continue
        pid = int(named.group(1))
        while alive(pid) and group is not None and process_group(pid) == group and time.monotonic() < deadline:
            time.sleep(0.05)  # killed with its trial, not yet dead
        if alive(pid):
            continue
        try:
            os.unlink(entry.path)
        except OSError:  # gone meanwhile, or not ours to remove
            continue
        removed.append(Path(entry.path))
    return removed
