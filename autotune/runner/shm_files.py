"""The shared-memory files that loader workers killed mid-batch leave in /dev/shm, removed after their trial.

A DataLoader worker puts each batch it hands over in a file it creates in /dev/shm (``torch_<pid>_...``) and unlinks
once the receiving process holds it. The kernel's out-of-memory killer picks the process that is filling such a file
(its pages count against the memory limit), so a worker killed there leaves it behind: 616 MB of a batch of 1024
images at 224 px stayed in /dev/shm after one such trial, memory no process could free, and in a container's small
/dev/shm enough to make every later trial with workers fail. After each trial, :func:`remove_dead_files` removes the
files of this user that were written during it by a process that no longer runs.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import psutil

__all__ = ["SHM_DIR", "remove_dead_files"]

SHM_DIR = Path("/dev/shm")

#: A file torch names after the process that created it.
_TORCH_FILE = re.compile(r"torch_(\d+)_")


def remove_dead_files(since: float, directory: Path = SHM_DIR) -> int:
    """Remove ``torch_<pid>_*`` files in ``directory`` owned by this user, changed at or after ``since`` (seconds since
    the epoch: a trial's start), whose creating process is gone. Another program's files (older, another user's, or
    of a process that still runs) are left alone.

    Returns:
        The bytes freed (0 where there is no such directory).
    """
    freed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        match = _TORCH_FILE.match(entry.name)
        if match is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mtime < since
                    or psutil.pid_exists(int(match.group(1)))):
                continue
            os.unlink(entry.path)
        except OSError:  # removed meanwhile, or not ours to remove
            continue
        freed += info.st_size
    return freed
