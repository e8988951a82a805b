"""Memory probe: RAM (its cgroup limit, the address-space ulimit) and the /dev/shm that workers use."""

from __future__ import annotations

import os
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.cgroup import CGROUP_ROOT, memory_headroom, memory_limit

__all__ = ["SHM_PATH", "MemoryInfo", "ShmInfo", "address_space_limit", "collect_memory", "collect_shm"]

SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class MemoryInfo:
    """System RAM.

    Attributes:
        total_bytes: Physical RAM of the machine (host-wide, also in containers).
        available_bytes: RAM that can be handed out without swapping.
        cgroup_limit_bytes: The cgroup memory limit of this process (a
            container's ``--memory``), None when unlimited or unknown.
        address_space_limit_bytes: The virtual memory this process may map
            (``ulimit -v``, the soft ``RLIMIT_AS``), None when unlimited.
        cgroup_available_bytes: What the cgroup limit leaves: the limit less
            the group's anonymous and shared memory; None without a limit.
    """

    total_bytes: int
    available_bytes: int
    cgroup_limit_bytes: int | None = None
    address_space_limit_bytes: int | None = None
    cgroup_available_bytes: int | None = None

    def usable_bytes(self) -> int:
        """RAM this process may still use: the host's available RAM, or less where a cgroup limit (a container's
        ``--memory``) leaves less."""
        room = self.cgroup_available_bytes
        return self.available_bytes if room is None else min(self.available_bytes, room)

    def limited_by_cgroup(self) -> bool:
        """Whether a cgroup limit (a container's ``--memory``), not the host's RAM, leaves this process the least."""
        return self.cgroup_available_bytes is not None and self.cgroup_available_bytes < self.available_bytes

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (the ``memory`` object)."""
        return {
            "total_bytes": self.total_bytes,
            "available_bytes": self.available_bytes,
            "cgroup_limit_bytes": self.cgroup_limit_bytes,
            "address_space_limit_bytes": self.address_space_limit_bytes,
            "cgroup_available_bytes": self.cgroup_available_bytes,
        }


@dataclass(frozen=True)
class ShmInfo:
    """The shared-memory filesystem through which DataLoader workers pass batches.

    Attributes:
        path: The directory probed (``/dev/shm``).
        total_bytes: Its size, None when it is missing or unreadable.
        free_bytes: Its free space, None when missing or unreadable.
        writable: Whether this process may create files in it (a read-only mount, or one without write permission:
            every loader worker fails to hand a batch over).
        open_files_limit: The soft ``RLIMIT_NOFILE`` (``ulimit -n``): a worker hands each batch over through a file
            descriptor of its shared memory; None when unlimited.
    """

    path: str
    total_bytes: int | None
    free_bytes: int | None
    writable: bool = True
    open_files_limit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (the ``shm`` object)."""
        return {"path": self.path, "total_bytes": self.total_bytes, "free_bytes": self.free_bytes, "writable": self.writable,
                "open_files_limit": self.open_files_limit}


def open_files_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` (``ulimit -n``); None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def address_space_limit() -> int | None:
    """The soft ``RLIMIT_AS`` (``ulimit -v``) in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def collect_memory(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> MemoryInfo:
    """Probe RAM with ``psutil.virtual_memory()``, the cgroup memory limit and ``ulimit -v``.

    Args:
        cgroup_root: Where the cgroup filesystems are mounted.
        proc_cgroup: Contents of ``/proc/self/cgroup``; read when None.

    Returns:
        The :class:`MemoryInfo`.
    """
    import psutil

    vm = psutil.virtual_memory()
    return MemoryInfo(
        total_bytes=int(vm.total),
        available_bytes=int(vm.available),
        cgroup_limit_bytes=memory_limit(cgroup_root, proc_cgroup),
        address_space_limit_bytes=address_space_limit(),
        cgroup_available_bytes=memory_headroom(cgroup_root, proc_cgroup),
    )


def collect_shm(path: str = SHM_PATH) -> ShmInfo:
    """Probe the size of the shared-memory filesystem.

    Args:
        path: The directory to measure.

    Returns:
        The :class:`ShmInfo`; sizes are None when ``path`` does not exist.
    """
    try:
        usage = shutil.disk_usage(path)
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return ShmInfo(path=path, total_bytes=None, free_bytes=None, writable=False, open_files_limit=open_files_limit())
    writable = not read_only and os.access(path, os.W_OK | os.X_OK)
    return ShmInfo(path=path, total_bytes=int(usage.total), free_bytes=int(usage.free), writable=writable,
                   open_files_limit=open_files_limit())
