"""Read CPU and memory limits from Linux control groups (v1, v2 and hybrid).

``os.cpu_count()`` and ``psutil.virtual_memory()`` describe the host. A
container started with ``docker run --cpus=2 --memory=8g`` (or a Kubernetes
pod with ``limits``) still sees every host core and all host RAM there; the
limits live in the cgroup the process belongs to. This module finds that
cgroup through ``/proc/self/cgroup`` and reads the limit files under
``/sys/fs/cgroup``.

Every function takes the root directory or the file contents as arguments,
so tests can point them at fixture trees instead of the real system.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = [
    "CGROUP_ROOT",
    "PROC_SELF_CGROUP",
    "CgroupEntry",
    "cpu_limit",
    "memory_headroom",
    "memory_limit",
    "oom_kills",
    "parse_cfs_quota",
    "parse_cpu_max",
    "parse_memory_limit",
    "parse_oom_kills",
    "parse_proc_cgroup",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
PROC_VMSTAT = Path("/proc/vmstat")

# cgroup v1 reports "no memory limit" as PAGE_COUNTER_MAX * page size, a value
# near 2**63 that differs by page size; anything this large means unlimited.
_UNLIMITED_BYTES = 2**60


@dataclass(frozen=True)
class CgroupEntry:
    """One line of ``/proc/<pid>/cgroup``: ``hierarchy-id:controllers:path``.

    Attributes:
        hierarchy: The hierarchy id; ``"0"`` is the cgroup v2 (unified) line.
        controllers: The v1 controllers bound to the hierarchy (empty for v2).
        path: The cgroup's path relative to the hierarchy's root.
    """

    hierarchy: str
    controllers: tuple[str, ...]
    path: str


def parse_proc_cgroup(text: str) -> list[CgroupEntry]:
    """Parse the contents of ``/proc/self/cgroup``.

    Args:
        text: The file contents.

    Returns:
        One entry per well-formed line; malformed lines are skipped.
    """
    entries: list[CgroupEntry] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        names = tuple(c for c in controllers.split(",") if c)
        entries.append(CgroupEntry(hierarchy, names, path or "/"))
    return entries


def parse_cpu_max(text: str) -> float | None:
    """Parse a cgroup v2 ``cpu.max`` file (``"<quota> <period>"``).

    Args:
        text: The file contents, e.g. ``"150000 100000"`` or ``"max 100000"``.

    Returns:
        The quota in CPUs (``1.5`` for ``"150000 100000"``), or None when
        there is no quota (``"max"``) or the text is malformed.
    """
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    try:
        quota = int(fields[0])
        period = int(fields[1]) if len(fields) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """Parse cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``.

    Args:
        quota_text: Contents of ``cpu.cfs_quota_us`` (``"-1"`` means no quota).
        period_text: Contents of ``cpu.cfs_period_us``.

    Returns:
        The quota in CPUs, or None when there is none or the text is malformed.
    """
    try:
        quota = int(quota_text.strip())
        period = int(period_text.strip())
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_memory_limit(text: str) -> int | None:
    """Parse ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1).

    Args:
        text: The file contents: a byte count, or ``"max"`` on v2.

    Returns:
        The limit in bytes, or None when unlimited or malformed.
    """
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        limit = int(value)
    except ValueError:
        return None
    if limit <= 0 or limit >= _UNLIMITED_BYTES:
        return None
    return limit


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _dirs_up(mount: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's directory under ``mount`` and its ancestors, innermost first.

    A limit set on any ancestor applies too, so all of them are read. When
    ``/proc/self/cgroup`` shows a host path that the container's mount does
    not contain (no cgroup namespace), the missing levels are skipped and
    the mount root, which then is the container's own cgroup, still counts.
    """
    parts = [p for p in PurePosixPath(cgroup_path).parts if p != "/"]
    if ".." in parts:  # a path outside our cgroup namespace: trust the mount root only
        parts = []
    dirs = [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def _v2_dirs(root: Path, entries: list[CgroupEntry]) -> list[Path]:
    line = next((e for e in entries if e.hierarchy == "0" and not e.controllers), None)
    if line is None:
        return []
    for mount in (root, root / "unified"):  # pure v2, then the hybrid layout
        if (mount / "cgroup.controllers").exists():
            return _dirs_up(mount, line.path)
    return []


def _v1_dirs(root: Path, entries: list[CgroupEntry], controller: str) -> list[Path]:
    for entry in entries:
        if controller not in entry.controllers:
            continue
        # Mounted as e.g. "cpu,cpuacct" with "cpu" usually a symlink to it.
        for name in (",".join(entry.controllers), controller):
            if (root / name).is_dir():
                return _dirs_up(root / name, entry.path)
    return []


def _entries(proc_cgroup: str | None) -> list[CgroupEntry]:
    text = proc_cgroup if proc_cgroup is not None else _read(PROC_SELF_CGROUP)
    return parse_proc_cgroup(text or "")


def cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The effective cgroup CPU quota of this process, in CPUs.

    Reads cgroup v2 ``cpu.max`` and cgroup v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` in the process's cgroup and every ancestor visible
    under ``root``; the smallest quota wins, as the kernel enforces all.

    Args:
        root: Where the cgroup filesystems are mounted.
        proc_cgroup: Contents of ``/proc/self/cgroup``; read from the system
            when None.

    Returns:
        The quota in CPUs (may be fractional, e.g. ``1.5``), or None when no
        quota is set or nothing could be read (e.g. not Linux).
    """
    entries = _entries(proc_cgroup)
    limits: list[float] = []
    for d in _v2_dirs(root, entries):
        text = _read(d / "cpu.max")
        limit = parse_cpu_max(text) if text is not None else None
        if limit is not None:
            limits.append(limit)
    for d in _v1_dirs(root, entries, "cpu"):
        quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        limit = parse_cfs_quota(quota, period) if quota is not None and period is not None else None
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def _memory_levels(root: Path, proc_cgroup: str | None) -> list[tuple[Path, int]]:
    """Each memory cgroup of this process and its visible ancestors that sets a limit, with the limit in bytes."""
    entries = _entries(proc_cgroup)
    levels = []
    for d, name in [(d, "memory.max") for d in _v2_dirs(root, entries)] + [
        (d, "memory.limit_in_bytes") for d in _v1_dirs(root, entries, "memory")
    ]:
        text = _read(d / name)
        limit = parse_memory_limit(text) if text is not None else None
        if limit is not None:
            levels.append((d, limit))
    return levels


def memory_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """The effective cgroup memory limit of this process, in bytes.

    Reads cgroup v2 ``memory.max`` and cgroup v1 ``memory.limit_in_bytes``
    in the process's cgroup and its visible ancestors; the smallest wins.

    Args:
        root: Where the cgroup filesystems are mounted.
        proc_cgroup: Contents of ``/proc/self/cgroup``; read when None.

    Returns:
        The limit in bytes, or None when unlimited or unreadable.
    """
    limits = [limit for _, limit in _memory_levels(root, proc_cgroup)]
    return min(limits) if limits else None


#: The ``memory.stat`` entries of what a cgroup holds that the kernel cannot reclaim without swap, each with the shared
#: memory that older kernels do not list (v1 before 4.x has no ``total_shmem``): v2's, then v1's hierarchical ones.
_HELD = (("anon", "shmem"), ("total_rss", "total_shmem"))


def memory_headroom(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int | None:
    """What the cgroup memory limits leave this process: at each level that sets one, the limit less what the group
    holds (``memory.stat``: anonymous memory and shared memory such as /dev/shm files; page cache, which the kernel
    reclaims before it kills, and kernel memory left aside); the smallest.

    Args:
        root: Where the cgroup filesystems are mounted.
        proc_cgroup: Contents of ``/proc/self/cgroup``; read when None.

    Returns:
        The bytes left, or None when no limit is set or readable (a level whose ``memory.stat`` is unreadable counts
        its whole limit).
    """
    room = []
    for directory, limit in _memory_levels(root, proc_cgroup):
        stat = {key: value for key, _, value in (line.partition(" ") for line in (_read(directory / "memory.stat") or "").splitlines())}
        counts = {key: int(value) for key, value in stat.items() if value.strip().isdigit()}
        held = next((counts[main] + counts.get(shared, 0) for main, shared in _HELD if main in counts), 0)
        room.append(max(0, limit - held))
    return min(room) if room else None


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill`` counter in the contents of ``/proc/vmstat``, cgroup v2
    ``memory.events`` or cgroup v1 ``memory.oom_control``; None if absent."""
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def oom_kills(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None, vmstat: Path = PROC_VMSTAT) -> int | None:
    """Processes the kernel's out-of-memory killer has killed, as far as this process can see.

    The sum of the system's counter (``/proc/vmstat``) and those of this
    process's memory cgroup and its visible ancestors (v2 ``memory.events``,
    v1 ``memory.oom_control``; a container's limit is enforced there). Two
    readings around a process's life tell whether the OOM killer acted
    meanwhile: the counters are raised before its SIGKILL is sent.

    Returns:
        The sum, or None when no counter can be read (not Linux, kernel before 4.13).
    """
    entries = _entries(proc_cgroup)
    files = [vmstat, *(d / "memory.events" for d in _v2_dirs(root, entries)),
             *(d / "memory.oom_control" for d in _v1_dirs(root, entries, "memory"))]
    counts = [n for n in (parse_oom_kills(text) for text in map(_read, files) if text is not None) if n is not None]
    return sum(counts) if counts else None
