"""probes: what the machine offers a PyTorch training run.

A standalone hardware probe (it knows nothing of autotune): CPU cores that
DataLoader workers can really use, RAM, /dev/shm, NVIDIA GPUs through NVML
(without initialising CUDA) and software versions.

Public API::

    import probes

    hw = probes.collect()            # -> Hardware, with .to_dict()
    console.print(probes.render(hw)) # Rich tables
    probes.usable_cores()            # cheap: affinity mask capped by cgroup quota
"""

from __future__ import annotations

from probes.cgroup import cpu_limit, memory_limit
from probes.cpu import CpuInfo, collect_cpu, usable_cores
from probes.gpu import GpuInfo, GpuReport, collect_gpus
from probes.hardware import Hardware, collect, hardware_warnings
from probes.memory import MemoryInfo, ShmInfo, collect_memory, collect_shm
from probes.render import render
from probes.software import SoftwareInfo, collect_software
from probes.units import format_bytes

__all__ = [
    "CpuInfo",
    "GpuInfo",
    "GpuReport",
    "Hardware",
    "MemoryInfo",
    "ShmInfo",
    "SoftwareInfo",
    "collect",
    "collect_cpu",
    "collect_gpus",
    "collect_memory",
    "collect_shm",
    "collect_software",
    "cpu_limit",
    "format_bytes",
    "hardware_warnings",
    "memory_limit",
    "render",
    "usable_cores",
]
