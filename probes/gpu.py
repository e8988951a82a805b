"""GPU probe through NVML (package ``nvidia-ml-py``), without touching CUDA.

Nothing here calls ``torch.cuda``: creating a CUDA context in the parent
process breaks DataLoader workers forked later ("Cannot re-initialize CUDA in
forked subprocess"). NVML talks to the driver directly and gives the compute
capability too, so the probe is safe to run before training.

NVML lists every GPU of the machine in PCI bus order and ignores
``CUDA_VISIBLE_DEVICES``; ``index`` is NVML's index, not necessarily
``torch.cuda``'s.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["NVML_HUNG", "GpuInfo", "GpuReport", "collect_gpus"]

#: Seconds NVML may take to answer before the probe gives up on it: a hung driver or GPU blocks ``nvmlInit`` (and
#: ``nvidia-smi``) for good, and the probe (every search starts with it) with it.
NVML_TIMEOUT_S = 30.0
#: How the probe's ``gpu_error`` starts when NVML did not answer in time.
NVML_HUNG = "NVML did not answer within"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it; a field whose query failed is None.

    Attributes:
        index: NVML device index (PCI bus order).
        name: Product name, e.g. ``"NVIDIA H100 80GB HBM3"``.
        uuid: The GPU's UUID (``"GPU-..."``), usable in ``CUDA_VISIBLE_DEVICES``.
        memory_total_bytes: Total device memory.
        memory_free_bytes: Free device memory right now.
        memory_used_by_others_bytes: Memory in use that is not this process's
            (used minus what NVML lists for our pid; includes the driver's
            small reservation).
        other_processes: Processes other than this one with a context on the
            GPU (only those NVML can see from here).
        compute_capability: ``"major.minor"``, e.g. ``"9.0"``.
        bf16: Native bf16 tensor cores (compute capability >= 8.0).
        tf32: TF32 tensor cores (compute capability >= 8.0).
        driver_version: The NVIDIA driver version.
        pcie_generation: Current PCIe link generation (drops at idle on
            power-saving GPUs).
        pcie_width: Current PCIe link width (lanes).
        pcie_max_generation: Highest generation the GPU and slot support.
        pcie_max_width: Widest link the GPU and slot support.
        cpu_affinity: The CPUs NVML names as nearest the GPU (those of its NUMA node or socket), sorted; None
            where NVML cannot say. Parallel trials and a trial's ranks take their cores from these first.
        query_errors: ``(field, NVML error)`` for each failed query; a JSON
            object in :meth:`to_dict`.
    """

    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_used_by_others_bytes: int | None = None
    other_processes: int | None = None
    compute_capability: str | None = None
    bf16: bool | None = None
    tf32: bool | None = None
    driver_version: str | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    cpu_affinity: tuple[int, ...] | None = None
    query_errors: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (one entry of ``gpus``)."""
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_free_bytes": self.memory_free_bytes,
            "memory_used_by_others_bytes": self.memory_used_by_others_bytes,
            "other_processes": self.other_processes,
            "compute_capability": self.compute_capability,
            "bf16": self.bf16,
            "tf32": self.tf32,
            "driver_version": self.driver_version,
            "pcie_generation": self.pcie_generation,
            "pcie_width": self.pcie_width,
            "pcie_max_generation": self.pcie_max_generation,
            "pcie_max_width": self.pcie_max_width,
            "cpu_affinity": list(self.cpu_affinity) if self.cpu_affinity is not None else None,
            "query_errors": dict(self.query_errors),
        }


@dataclass(frozen=True)
class GpuReport:
    """The result of :func:`collect_gpus`.

    Attributes:
        gpus: The GPUs found (empty when none could be read).
        error: Why no GPU could be read, one line; None when NVML worked.
        driver_loaded: True when NVML initialised, i.e. an NVIDIA driver runs.
    """

    gpus: tuple[GpuInfo, ...]
    error: str | None
    driver_loaded: bool


def _error_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # NVMLError.__str__ itself calls into NVML
        text = ""
    return text or type(exc).__name__


def _init_error(nvml: ModuleType, exc: BaseException) -> str:
    """One line saying why nvmlInit failed."""
    value = getattr(exc, "value", None)
    cls = type(exc).__name__

    def is_(const: str, default: int, suffix: str) -> bool:
        return value == getattr(nvml, const, default) or cls.endswith(suffix)

    detail = _error_text(exc)
    if is_("NVML_ERROR_LIBRARY_NOT_FOUND", 12, "LibraryNotFound"):
        return "NVML library not found (no NVIDIA driver installed)"
    if is_("NVML_ERROR_DRIVER_NOT_LOADED", 9, "DriverNotLoaded"):
        return "NVIDIA driver not loaded (NVML: Driver Not Loaded)"
    if is_("NVML_ERROR_NO_PERMISSION", 4, "NoPermission"):
        return "no permission to talk to the NVIDIA driver (NVML: Insufficient Permissions)"
    if is_("NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18, "LibRmVersionMismatch"):
        return "NVML and the loaded NVIDIA driver differ in version (reboot after a driver upgrade?)"
    return f"NVML initialisation failed: {detail}"


def _decode(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


#: The 64-bit words of NVML's CPU mask that hold every CPU of this machine.
_CPU_SET_WORDS = max(1, ((os.cpu_count() or 1) + 63) // 64)


def _cpus(words: Any) -> tuple[int, ...] | None:
    """The CPU ids set in NVML's affinity mask (64 CPUs a word, the lowest bit first); None for no mask or an empty one."""
    if words is None:
        return None
    cpus = tuple(64 * k + bit for k, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1)
    return cpus or None


def _read_gpu(nvml: ModuleType, index: int, driver_version: str | None) -> GpuInfo:
    errors: dict[str, str] = {}

    def query(key: str, fn: str, *args: Any) -> Any:
        try:
            return getattr(nvml, fn)(*args)
        except Exception as exc:  # NVMLError, or a function this nvidia-ml-py lacks
            errors[key] = _error_text(exc)
            return None

    handle = query("handle", "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return GpuInfo(index=index, driver_version=driver_version, query_errors=tuple(errors.items()))

    name = _decode(query("name", "nvmlDeviceGetName", handle))
    uuid = _decode(query("uuid", "nvmlDeviceGetUUID", handle))
    mem = query("memory", "nvmlDeviceGetMemoryInfo", handle)
    total = int(mem.total) if mem is not None else None
    free = int(mem.free) if mem is not None else None

    cc = query("compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
    capability = f"{int(cc[0])}.{int(cc[1])}" if cc is not None else None
    ampere_plus = (int(cc[0]), int(cc[1])) >= (8, 0) if cc is not None else None

    own_pid = os.getpid()
    own_bytes = 0
    others: set[int] | None = None
    for key, fn in (("processes", "nvmlDeviceGetComputeRunningProcesses"),
                    ("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses")):
        procs = query(key, fn, handle)
        if procs is None:
            continue
        others = others if others is not None else set()
        for proc in procs:
            pid = getattr(proc, "pid", None)
            if pid == own_pid:
                own_bytes += int(getattr(proc, "usedGpuMemory", None) or 0)
            elif pid is not None:
                others.add(int(pid))
    used_by_others = max(0, total - free - own_bytes) if total is not None and free is not None else None

    def as_int(value: Any) -> int | None:
        return int(value) if value is not None else None

    return GpuInfo(
        index=index,
        name=name,
        uuid=uuid,
        memory_total_bytes=total,
        memory_free_bytes=free,
        memory_used_by_others_bytes=used_by_others,
        other_processes=len(others) if others is not None else None,
        compute_capability=capability,
        bf16=ampere_plus,
        tf32=ampere_plus,
        driver_version=driver_version,
        pcie_generation=as_int(query("pcie_generation", "nvmlDeviceGetCurrPcieLinkGeneration", handle)),
        pcie_width=as_int(query("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", handle)),
        pcie_max_generation=as_int(query("pcie_max_generation", "nvmlDeviceGetMaxPcieLinkGeneration", handle)),
        pcie_max_width=as_int(query("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", handle)),
        cpu_affinity=_cpus(query("cpu_affinity", "nvmlDeviceGetCpuAffinity", handle, _CPU_SET_WORDS)),
        query_errors=tuple(errors.items()),
    )


def collect_gpus() -> GpuReport:
    """Read every NVIDIA GPU through NVML; never raises.

    Without ``nvidia-ml-py``, the NVML library or a running driver, the
    report has no GPUs and a one-line ``error``. A GPU whose queries fail in
    part keeps the other fields (see :attr:`GpuInfo.query_errors`). NVML that
    has not answered after :data:`NVML_TIMEOUT_S` (a hung driver) is left
    behind in its thread, and the report says so.

    Returns:
        The :class:`GpuReport`.
    """
    try:
        import pynvml as nvml
    except ImportError as exc:
        return GpuReport((), f"nvidia-ml-py is not installed ({exc})", driver_loaded=False)
    except Exception as exc:  # a broken build or a shim that raises as it loads: the GPUs are unknown, the rest stands
        return GpuReport((), f"nvidia-ml-py failed to import: {_error_text(exc)}", driver_loaded=False)

    answers: list[GpuReport] = []
    # In a thread of its own: one stuck in the driver cannot be stopped, but the probe can go on without it.
    def read() -> None:
        try:
            answers.append(_read_gpus(nvml))
        except BaseException as exc:  # a shim's SystemExit, an error no query caught: said as what it is, not as a hang
            if threading.current_thread() is threading.main_thread() and isinstance(exc, KeyboardInterrupt):
                raise  # read inline (no thread to be had): a Ctrl-C or SIGTERM stops the command, as anywhere else
            answers.append(GpuReport((), f"NVML failed: {_error_text(exc)}", driver_loaded=False))

    reader = threading.Thread(target=read, name="autotune-nvml", daemon=True)
    try:
        reader.start()
    except RuntimeError:  # no thread to be had (ulimit -u reached): read here, rather than not at all; a hung driver
        read()  # then hangs the probe, as nvidia-smi would
        return answers[0]
    reader.join(NVML_TIMEOUT_S)
    if not answers:
        return GpuReport((), f"{NVML_HUNG} {NVML_TIMEOUT_S:g} s (a hung NVIDIA driver or GPU: nvidia-smi would hang "
                             "too), so the GPUs are unknown", driver_loaded=False)
    return answers[0]


def _read_gpus(nvml: ModuleType) -> GpuReport:
    """:func:`collect_gpus`'s reading through an imported NVML module; never raises."""
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return GpuReport((), _init_error(nvml, exc), driver_loaded=False)
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return GpuReport((), f"NVML could not count the GPUs: {_error_text(exc)}", driver_loaded=True)
        try:
            driver = _decode(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        try:
            gpus = tuple(_read_gpu(nvml, i, driver) for i in range(count))
        except Exception as exc:  # not a query's failure (each is kept per field): a broken module
            return GpuReport((), f"NVML failed while reading the GPUs: {_error_text(exc)}", driver_loaded=True)
        error = None if gpus else "the NVIDIA driver is loaded but NVML reports no GPU"
        return GpuReport(gpus, error, driver_loaded=True)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
