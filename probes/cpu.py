"""CPU probe: model, core counts that DataLoader workers can really use, bf16."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.cgroup import CGROUP_ROOT, cpu_limit

__all__ = [
    "BF16_FLAGS",
    "CPUINFO",
    "THREAD_VARIABLES",
    "CpuInfo",
    "affinity_cores",
    "collect_cpu",
    "env_threads",
    "in_topology_order",
    "native_bf16_flags",
    "quota_to_cores",
    "read_cpuinfo",
    "usable_cores",
]

CPUINFO = Path("/proc/cpuinfo")
#: Where Linux describes each logical CPU's socket and physical core.
CPU_SYSFS = Path("/sys/devices/system/cpu")

#: /proc/cpuinfo flags that mean the CPU computes bf16 natively: x86 AMX and
#: AVX-512 BF16, and the ``bf16`` feature of ARMv8.6+ cores (listed under
#: "Features" on aarch64).
BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16", "bf16")
#: The environment variables that set torch's own intra-op thread count where no ``torch.set_num_threads`` call does
#: (``MKL_NUM_THREADS`` before ``OMP_NUM_THREADS`` where both are set).
THREAD_VARIABLES: tuple[str, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU offers this process.

    Attributes:
        model: The CPU model name, or None when unknown.
        logical_cores: ``os.cpu_count()``: every logical core of the machine.
        physical_cores: Physical cores (``psutil``), None when unknown.
        usable_cores: Cores this process can keep busy (affinity mask capped
            by the cgroup CPU quota); size ``num_workers`` from this.
        affinity_cores: Cores in this process's CPU affinity mask.
        cgroup_cpu_limit: The cgroup CPU quota in CPUs, None when unlimited.
        bf16: True when the CPU runs bf16 autocast natively.
        bf16_flags: The CPU flags behind ``bf16`` (e.g. ``avx512_bf16``).
        thread_env: The :data:`THREAD_VARIABLES` set in this process's environment, as (name, value) pairs.
        env_threads: Torch's own intra-op thread count under :attr:`thread_env` (None: the variables name no count):
            their count, or where it is above the logical cores the count a fresh torch process reports (its OpenMP
            runtime may give no more threads than the cores: torch 2.14 ran 2 for ``OMP_NUM_THREADS=8`` on 2 cores).
    """

    model: str | None
    logical_cores: int
    physical_cores: int | None
    usable_cores: int
    affinity_cores: int
    cgroup_cpu_limit: float | None
    bf16: bool
    bf16_flags: tuple[str, ...] = ()
    thread_env: tuple[tuple[str, str], ...] = ()
    env_threads: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (the ``cpu`` object of ``probe --json``)."""
        return {
            "model": self.model,
            "logical_cores": self.logical_cores,
            "physical_cores": self.physical_cores,
            "usable_cores": self.usable_cores,
            "affinity_cores": self.affinity_cores,
            "cgroup_cpu_limit": self.cgroup_cpu_limit,
            "bf16": self.bf16,
            "bf16_flags": list(self.bf16_flags),
            "thread_env": dict(self.thread_env),
            "env_threads": self.env_threads,
        }


def env_threads(env: dict[str, str], logical_cores: int) -> int | None:
    """Torch's own intra-op thread count under the :data:`THREAD_VARIABLES` of ``env`` (None: they name no count; torch
    reads ``MKL_NUM_THREADS`` first, and OpenMP the first level of a list such as ``4,2``). A count above
    ``logical_cores`` is asked of a fresh torch process, which may cap it (the variable's count where that fails)."""
    count = None
    for name in reversed(THREAD_VARIABLES):
        value = env.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            count = int(value)
            break
    if count is None or count <= logical_cores:
        return count
    try:
        said = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True,
                              timeout=120, check=True, env={**os.environ, **env}).stdout.split()
        return int(said[-1]) if said and said[-1].isdigit() and int(said[-1]) > 0 else count
    except (OSError, subprocess.SubprocessError):
        return count


def affinity_cores() -> int:
    """Cores in this process's CPU affinity mask.

    ``taskset``, ``numactl`` and cpuset cgroups (``docker --cpuset-cpus``)
    all show up here. Falls back to ``os.cpu_count()`` where the platform
    has no ``sched_getaffinity`` (macOS, Windows).

    Returns:
        At least 1.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def in_topology_order(cpus: list[int] | tuple[int, ...], sysfs: Path = CPU_SYSFS, keep: int | None = None) -> tuple[int, ...]:
    """``cpus`` ordered socket by socket, a physical core's hyperthreads side by side, so that contiguous slices hold
    whole cores of one socket; with ``keep`` (a CPU quota below the mask), only that many, one hyperthread of every
    core before any core's second (4 of 4 cores x 2 threads are 4 cores, not 2 cores' pairs).

    Linux numbers a two-socket SMT host's logical CPUs socket 0's cores, socket 1's, then their second hyperthreads
    (a DGX H100: 0-55, 56-111, then 112-223): cut in numeric order, the share of cuda:4 was the hyperthreads of cuda:0's
    cores, and cuda:2's lay on the far socket. Where sysfs does not say (another platform, a container hiding it), the
    numeric order stays.
    """

    def place(cpu: int) -> tuple[int, int, int]:
        try:
            topology = sysfs / f"cpu{cpu}" / "topology"
            return int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()), cpu
        except (OSError, ValueError):
            return -1, cpu, cpu

    places = [place(cpu) for cpu in cpus]
    if any(package < 0 for package, _, _ in places):  # partly known: no order is better than numbers
        return tuple(sorted(cpus)[:keep])
    places.sort()
    if keep is not None and keep < len(places):
        thread: list[int] = []  # 0 for a core's first hyperthread, 1 for its second
        seen: Counter[tuple[int, int]] = Counter()
        for package, core, _ in places:
            thread.append(seen[package, core])
            seen[package, core] += 1
        first = sorted(range(len(places)), key=lambda i: (thread[i], i))[:keep]  # every core's first hyperthread, then seconds
        places = [places[i] for i in sorted(first)]
    return tuple(cpu for _, _, cpu in places)


def quota_to_cores(limit: float) -> int:
    """Round a cgroup CPU quota down to whole cores, never below 1.

    The quota is a hard throttle: a container with ``--cpus=1.5`` running two
    busy workers is paused for the rest of every period once 150 ms of CPU
    time per 100 ms are used, which stalls the pipeline more than one fewer
    worker does. So 1.5 -> 1, 2.0 -> 2, 0.5 -> 1.

    Args:
        limit: The quota in CPUs, e.g. ``1.5``.

    Returns:
        ``max(1, floor(limit))``.
    """
    return max(1, math.floor(limit + 1e-9))


def usable_cores(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None, affinity: int | None = None) -> int:
    """Cores that DataLoader workers can really use: cheap, no torch import.

    The affinity mask (:func:`affinity_cores`) capped by the cgroup CPU quota
    (:func:`probes.cgroup.cpu_limit`, rounded by :func:`quota_to_cores`). A
    quota above the affinity mask does not raise the count.

    Args:
        root: Where the cgroup filesystems are mounted (tests pass fixtures).
        proc_cgroup: Contents of ``/proc/self/cgroup``; read when None.
        affinity: The affinity core count; measured when None.

    Returns:
        At least 1.
    """
    cores = affinity if affinity is not None else affinity_cores()
    limit = cpu_limit(root, proc_cgroup)
    if limit is not None:
        cores = min(cores, quota_to_cores(limit))
    return max(1, cores)


def read_cpuinfo(path: Path = CPUINFO) -> tuple[str | None, frozenset[str] | None]:
    """Read the model name and the feature flags of the first CPU.

    Args:
        path: The cpuinfo file.

    Returns:
        ``(model, flags)``; either is None when the file or the line is
        missing (not Linux, or an architecture without the field).
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, None
    model: str | None = None
    flags: frozenset[str] | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and model is None:
            model = value.strip() or None
        elif key in ("flags", "features") and flags is None:
            flags = frozenset(value.split())
        if model is not None and flags is not None:
            break
    return model, flags


def _torch_bf16_flags() -> tuple[str, ...]:
    """Ask torch which bf16 instructions the CPU has (imports torch: slow)."""
    try:
        import torch.cpu

        found = []
        if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
            found.append("amx_tile")
        if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
            found.append("avx512_bf16")
        return tuple(found)
    except Exception:  # a probe never crashes on a missing or odd torch
        return ()


def native_bf16_flags(cpuinfo: Path = CPUINFO) -> tuple[str, ...]:
    """The CPU's native bf16 units: from ``/proc/cpuinfo``'s flags; torch's view where it has no flags line (not Linux)."""
    return _bf16_units(read_cpuinfo(cpuinfo)[1])


def _bf16_units(flags: frozenset[str] | None) -> tuple[str, ...]:
    return tuple(f for f in BF16_FLAGS if f in flags) if flags is not None else _torch_bf16_flags()


def collect_cpu(cpuinfo: Path = CPUINFO, cgroup_root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> CpuInfo:
    """Probe the CPU.

    The bf16 flags come from ``/proc/cpuinfo``; only where it has no flags
    line (not Linux) does this ask torch, which costs a torch import.

    Args:
        cpuinfo: The cpuinfo file.
        cgroup_root: Where the cgroup filesystems are mounted.
        proc_cgroup: Contents of ``/proc/self/cgroup``; read when None.

    Returns:
        The CPU's :class:`CpuInfo`.
    """
    import psutil

    model, flags = read_cpuinfo(cpuinfo)
    model = model or platform.processor() or None
    bf16_flags = _bf16_units(flags)
    affinity = affinity_cores()
    limit = cpu_limit(cgroup_root, proc_cgroup)
    usable = min(affinity, quota_to_cores(limit)) if limit is not None else affinity
    return CpuInfo(
        model=model,
        logical_cores=os.cpu_count() or affinity,
        physical_cores=psutil.cpu_count(logical=False),
        usable_cores=max(1, usable),
        affinity_cores=affinity,
        cgroup_cpu_limit=limit,
        bf16=bool(bf16_flags),
        bf16_flags=bf16_flags,
        thread_env=tuple((name, os.environ[name]) for name in THREAD_VARIABLES if name in os.environ),
        env_threads=env_threads(dict(os.environ), os.cpu_count() or affinity),
    )
