"""The whole probe: collect every part and derive the warnings."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from probes.cpu import CpuInfo, collect_cpu
from probes.gpu import GpuInfo, collect_gpus
from probes.memory import MemoryInfo, ShmInfo, address_space_limit, collect_memory, collect_shm
from probes.software import SoftwareInfo, collect_software
from probes.units import GIB, format_bytes, format_cpus

__all__ = ["GPU_BUSY_FRACTION", "SHM_MIN_BYTES", "Hardware", "address_space_note", "address_space_warning", "collect", "hardware_warnings"]

#: Below this, /dev/shm gets a warning (Docker's default is 64 MiB).
SHM_MIN_BYTES = 1 * GIB
#: Above this fraction of a GPU's memory used by others, the GPU gets a warning.
GPU_BUSY_FRACTION = 0.5


@dataclass(frozen=True)
class Hardware:
    """Everything ``autotune probe`` reports.

    Attributes:
        cpu: The CPU.
        memory: System RAM.
        shm: The shared-memory filesystem.
        gpus: The GPUs NVML could read (empty without a driver).
        gpu_error: Why no GPU could be read, one line; None when NVML worked.
        cuda_visible_devices: The ``CUDA_VISIBLE_DEVICES`` environment
            variable (None when unset); NVML lists all GPUs regardless.
        software: Versions.
        warnings: Problems worth fixing before a search, one sentence each.
    """

    cpu: CpuInfo
    memory: MemoryInfo
    shm: ShmInfo
    gpus: tuple[GpuInfo, ...]
    gpu_error: str | None
    software: SoftwareInfo
    warnings: tuple[str, ...]
    cuda_visible_devices: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form printed by ``autotune probe --json``."""
        return {
            "cpu": self.cpu.to_dict(),
            "memory": self.memory.to_dict(),
            "shm": self.shm.to_dict(),
            "gpus": [gpu.to_dict() for gpu in self.gpus],
            "gpu_error": self.gpu_error,
            "cuda_visible_devices": self.cuda_visible_devices,
            "software": self.software.to_dict(),
            "warnings": list(self.warnings),
        }


#: A soft ``ulimit -n`` below this is said (Linux's default is 1024; loader workers fail or hang at a few dozen).
LOW_OPEN_FILES = 1024


def _open_files_low(limit: int | None) -> bool:
    """Whether ``limit`` (``ulimit -n``) is below :data:`LOW_OPEN_FILES` on Linux, where torch hands a loader worker's
    batches over by file descriptor (macOS: by file name)."""
    return limit is not None and limit < LOW_OPEN_FILES and sys.platform.startswith("linux")


def open_files_note(limit: int | None) -> str:
    """`` (ulimit -n allows this process 32 open files: ...)`` to end a loader failure's line with; empty at a usual limit."""
    if not _open_files_low(limit):
        return ""
    return (f" (ulimit -n allows this process {limit} open files, and loader workers hand each batch over through a file "
            "descriptor: raise it, ulimit -n 4096)")


def _open_files_warning(shm: ShmInfo) -> str | None:
    limit = shm.open_files_limit
    if not _open_files_low(limit):
        return None
    return (f"ulimit -n allows this process {limit} open files: DataLoader workers (num_workers > 0) hand every batch over "
            "through a file descriptor of its shared memory, so trials with workers may fail ('exited unexpectedly') or hang "
            "until their timeout; raise it (ulimit -n 4096) before a search.")


def _shm_warning(shm: ShmInfo) -> str | None:
    if shm.total_bytes is None:
        if not sys.platform.startswith("linux"):
            return None
        return (
            f"{shm.path} is missing or unreadable: DataLoader workers (num_workers > 0) pass every batch "
            "to the main process through shared memory there; mount a tmpfs on it "
            "(in Docker: --shm-size=8g or --ipc=host)."
        )
    if not shm.writable:
        return (f"{shm.path} is read-only to this process: DataLoader workers (num_workers > 0) pass every batch to the main "
                "process through files there, so every setup with workers fails; mount a writable tmpfs on it "
                "(in Docker: drop a read-only --tmpfs /dev/shm, or use --shm-size=8g or --ipc=host).")
    if shm.total_bytes >= SHM_MIN_BYTES:
        return None
    return (
        f"{shm.path} is only {format_bytes(shm.total_bytes)} ({format_bytes(shm.free_bytes)} free): "
        "DataLoader workers (num_workers > 0) pass every batch to the main process through it, "
        "and with Docker's default of 64 MiB they crash with 'bus error' or "
        "'DataLoader worker ... killed by signal' once batches outgrow it. "
        "Restart the container with --shm-size=8g (or --ipc=host; Kubernetes: an emptyDir with medium: Memory)."
    )


def _cores_warning(cpu: CpuInfo) -> str | None:
    if cpu.usable_cores >= cpu.logical_cores:
        return None
    reasons = []
    if cpu.affinity_cores < cpu.logical_cores:
        reasons.append(
            f"the CPU affinity mask allows {cpu.affinity_cores} "
            "(taskset, numactl, docker --cpuset-cpus or a job scheduler)"
        )
    if cpu.cgroup_cpu_limit is not None and cpu.cgroup_cpu_limit < cpu.affinity_cores:  # 0.5 CPUs of one core in the mask too
        reasons.append(
            f"the cgroup CPU quota is {format_cpus(cpu.cgroup_cpu_limit)} (docker --cpus, Kubernetes limits.cpu)"
        )
    why = "; ".join(reasons) or "the platform reports fewer cores for this process"
    return (
        f"only {cpu.usable_cores} of {cpu.logical_cores} logical cores {'is' if cpu.usable_cores == 1 else 'are'} usable: {why}. "
        f"os.cpu_count() still says {cpu.logical_cores}; more DataLoader workers than "
        f"{cpu.usable_cores} just compete for the same cores."
    )


def _thread_env_warning(cpu: CpuInfo) -> str | None:
    """The thread variables set in the environment, where the count they give torch is not the usable cores (none for a
    value that is no count, OMP_NUM_THREADS=abc, 0 or empty: torch ignores it and counts the cores, as without it)."""
    count = cpu.env_threads
    if count is None or count == cpu.usable_cores:
        return None
    said = " and ".join(f"{name}={value}" for name, value in cpu.thread_env)
    return (f"{said} {'is' if len(cpu.thread_env) == 1 else 'are'} set in the environment: torch's own thread count (threads "
            f"auto, as the PyTorch defaults run) is {count}, set by {'it' if len(cpu.thread_env) == 1 else 'them'}, not the "
            f"{cpu.usable_cores} usable core{'s' if cpu.usable_cores != 1 else ''}: a search measures it so, and the emitted "
            "train.py warns where torch runs another count.")


def gpu_busy_warning(gpu: GpuInfo, device: str | None = None) -> str | None:
    """The sentence for a GPU whose memory other processes hold more than half of; None for one that is free enough.

    Args:
        gpu: The GPU as NVML reads it.
        device: The name a search runs it under (``cuda:K``, which counts the visible GPUs), said with NVML's index
            beside it; by default NVML's index alone, ``GPU n``.
    """
    total, others = gpu.memory_total_bytes, gpu.memory_used_by_others_bytes
    if not total or others is None or others <= GPU_BUSY_FRACTION * total:
        return None
    named = [f"NVML GPU {gpu.index}"] if device else []
    named += [gpu.name] if gpu.name else []
    label = f"{device or f'GPU {gpu.index}'}" + (f" ({', '.join(named)})" if named else "")
    return (
        f"{label}: {others / total:.0%} of its memory ({format_bytes(others)} of {format_bytes(total)}) "
        "is already used by other processes; the search has less room for batches and measures "
        "throughput on a shared GPU. Free the GPU or pick another with CUDA_VISIBLE_DEVICES."
    )


def _cgroup_memory_warning(memory: MemoryInfo) -> str | None:
    limit, usable = memory.cgroup_limit_bytes, memory.usable_bytes()
    if limit is None or usable >= memory.available_bytes:
        return None
    return (
        f"the cgroup memory limit is {format_bytes(limit)} ({format_bytes(usable)} of it free; docker --memory, Kubernetes "
        f"limits.memory) while the host has {format_bytes(memory.available_bytes)} available: training, its DataLoader "
        "workers and their shared memory all count against the limit, and a process over it is killed; a search sizes "
        "its batches to what the limit leaves."
    )


def _address_space(limit: int) -> str:
    return f"ulimit -v limits this process to {format_bytes(limit)} of address space"


def address_space_warning(limit: int | None) -> str | None:
    """The sentence for a ``ulimit -v`` of ``limit`` bytes (None: no limit, no sentence)."""
    if limit is None:
        return None
    return (
        f"{_address_space(limit)}: every library it maps counts, "
        "importing torch maps several GiB before the first tensor and a CUDA context reserves far more, so imports "
        "fail with 'failed to map segment' and trials run out of memory while RAM is free. "
        "Raise it (ulimit -v unlimited) before a search."
    )


def address_space_note() -> str:
    """`` (ulimit -v limits this process to 3.0 GiB of address space)`` to end an error line with; empty without a limit."""
    limit = address_space_limit()
    return f" ({_address_space(limit)})" if limit is not None else ""


def hardware_warnings(
    cpu: CpuInfo, shm: ShmInfo, gpus: tuple[GpuInfo, ...], memory: MemoryInfo | None = None
) -> tuple[str, ...]:
    """Derive the warnings from the probed parts.

    Args:
        cpu: The CPU probe.
        shm: The /dev/shm probe.
        gpus: The GPU probes.
        memory: The memory probe (its ``ulimit -v``, its cgroup limit); None leaves those checks out.

    Returns:
        One sentence per problem: /dev/shm under 1 GiB, an open-files limit under 1024 (Linux), fewer usable than
        logical cores, OMP_NUM_THREADS or MKL_NUM_THREADS set to another count, GPUs with more than half of their memory used by others,
        an address-space limit (``ulimit -v``), a cgroup memory limit that leaves
        less than the host's available RAM.
    """
    limit = memory.address_space_limit_bytes if memory is not None else None
    found = [_shm_warning(shm), _open_files_warning(shm), _cores_warning(cpu), _thread_env_warning(cpu),
             *(gpu_busy_warning(g) for g in gpus), address_space_warning(limit),
             _cgroup_memory_warning(memory) if memory is not None else None]
    return tuple(w for w in found if w)


def collect() -> Hardware:
    """Probe the machine: CPU, RAM, /dev/shm, GPUs (NVML) and versions.

    Does not initialise CUDA, and imports torch only when an NVIDIA driver is
    present. GPU problems end up in ``gpu_error``, never as an exception.

    Returns:
        The :class:`Hardware`.
    """
    cpu = collect_cpu()
    memory = collect_memory()
    shm = collect_shm()
    report = collect_gpus()
    software = collect_software(driver_loaded=report.driver_loaded)
    return Hardware(
        cpu=cpu,
        memory=memory,
        shm=shm,
        gpus=report.gpus,
        gpu_error=report.error,
        software=software,
        warnings=hardware_warnings(cpu, shm, report.gpus, memory),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
