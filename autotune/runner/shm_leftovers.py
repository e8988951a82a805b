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


#: How long a process named by such a file may take to end (a loader worker its trial's SIGKILL reached, not yet
#: scheduled to die on a loaded machine) before the file is left as a live process's.
ENDING_S = 2.0


def remove_failed_allocations(since: float, directory: str | Path = SHM_PATH, ending_s: float = ENDING_S) -> list[Path]:
    """Remove PyTorch's files in ``directory`` that a failed allocation left: named for a process that has ended
    (given ``ending_s`` to end: the trial's workers were just killed), holding no block of memory (the allocation never
    took one, so no process can have read a tensor from it), and changed at or after ``since``.

    Args:
        since: When the run that failed began (``time.time()``); older files are not looked at.
        directory: Where the files are.
        ending_s: How long to wait for the processes they name to end.

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
        while alive(int(named.group(1))):  # a killed worker on a loaded machine was still running (a CI run left its file)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        else:
            try:
                os.unlink(entry.path)
            except OSError:  # gone meanwhile, or not ours to remove
                continue
            removed.append(Path(entry.path))
    return removed
