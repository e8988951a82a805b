"""Devices: which one trials run on, as the probe saw it.

:func:`device_type` is the one place that splits ``"cuda:0"`` into its type;
:func:`resolve_device` turns what the user typed into a :class:`DeviceInfo`
before any trial starts, so bad input fails fast with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import UsageError
from probes.gpu import NVML_HUNG

if TYPE_CHECKING:  # pragma: no cover - the probe is only read here
    from probes import Hardware


def device_type(device: object) -> str:
    """``"cpu"`` or ``"cuda"`` for ``"cpu"``, ``"cuda:1"`` or a ``torch.device``."""
    return str(device).split(":", 1)[0]


@dataclass(frozen=True)
class DeviceInfo:
    """The device trials run on, as the probe saw it."""

    name: str  # "cpu", "cuda:0", ...
    bf16: bool
    memory_total_bytes: int | None
    memory_free_bytes: int | None
    label: str
    tf32: bool = False
    near_cpus: tuple[int, ...] | None = None  # a GPU's nearest CPUs as NVML names them (probes.gpu.GpuInfo.cpu_affinity)

    @property
    def type(self) -> str:
        """``cpu`` or ``cuda``."""
        return device_type(self.name)


def visible_gpus(gpus: list[Any], cuda_visible_devices: str | None) -> list[Any]:
    """The NVML GPUs in the order CUDA numbers them under ``CUDA_VISIBLE_DEVICES``.

    NVML lists every GPU of the machine; CUDA (and ``cuda:K``) counts only
    the visible ones, in the order the variable gives. Entries are NVML
    indices or (abbreviated) ``GPU-`` UUIDs; as in CUDA, the list ends at the
    first entry that names no device (``-1``, an index out of range).
    Integer indices assume CUDA enumerates GPUs in PCI order, as NVML does
    (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and the usual case on machines with
    one GPU model).

    Raises:
        UsageError: A MIG instance (``MIG-...``), which NVML's GPU list
            cannot describe.
    """
    if cuda_visible_devices is None:
        return list(gpus)
    visible: list[Any] = []
    for token in (t.strip() for t in cuda_visible_devices.split(",")):
        if token.upper().startswith("MIG-"):
            raise UsageError(
                f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} names a MIG instance; "
                "autotune reads GPUs through NVML and cannot size a MIG slice yet: use a full GPU"
            )
        if token.upper().startswith("GPU-"):
            matches = [g for g in gpus if str(getattr(g, "uuid", "") or "").upper().startswith(token.upper())]
            gpu = matches[0] if len(matches) == 1 else None
        elif token.isdigit() and int(token) < len(gpus):
            gpu = gpus[int(token)]
        else:
            gpu = None
        if gpu is None or any(g is gpu for g in visible):
            break
        visible.append(gpu)
    return visible


def resolve_device(text: str, hardware: Hardware) -> DeviceInfo:
    """Resolve ``auto``, ``cpu``, ``cuda`` or ``cuda:K`` against the probe.

    ``K`` counts the GPUs CUDA sees (``CUDA_VISIBLE_DEVICES`` applies), as
    ``torch.device("cuda:K")`` does.

    Args:
        text: What the user asked for.
        hardware: A ``probes.Hardware`` (GPUs come from NVML, so CUDA is not
            initialised in this process).

    Raises:
        UsageError: CUDA asked for but absent, or an index out of range.
    """
    hidden = getattr(hardware, "cuda_visible_devices", None)
    gpus = visible_gpus(list(getattr(hardware, "gpus", []) or []), hidden)
    cpu = hardware.cpu
    choice = str(text).strip().lower()  # a torch.device reads as "cpu" or "cuda:0"
    if choice == "auto":
        error = str(getattr(hardware, "gpu_error", None) or "")
        if not gpus and error.startswith(NVML_HUNG):  # a GPU host whose driver hangs: not a CPU search without a word
            raise UsageError(f"--device auto cannot tell whether this machine has a GPU: {error}; pass --device cpu to search the "
                             "CPU, or --device cuda once nvidia-smi answers")
        choice = "cuda:0" if gpus else "cpu"
    if choice == "cpu":
        model = getattr(cpu, "model", None) or "CPU"
        return DeviceInfo("cpu", bool(getattr(cpu, "bf16", False)), None, None, str(model))
    if choice == "cuda":
        choice = "cuda:0"
    if choice.startswith("cuda:"):
        index_text = choice.split(":", 1)[1]
        if not index_text.isdigit():
            raise UsageError(f"bad device {text!r}; use auto, cpu, cuda or cuda:K")
        if not gpus:
            reason = getattr(hardware, "gpu_error", None) or "no GPU found"
            if hidden is not None and getattr(hardware, "gpus", None):
                reason = f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
            raise UsageError(f"device {text!r} asked for, but no CUDA GPU is usable: {reason}")
        index = int(index_text)
        if index >= len(gpus):
            where = "visible" if hidden is not None else "present"
            raise UsageError(f"device {text!r}: only {len(gpus)} GPU(s) {where} (cuda:0..cuda:{len(gpus) - 1})")
        gpu = gpus[index]
        return DeviceInfo(
            f"cuda:{index}",
            bool(getattr(gpu, "bf16", False)),
            getattr(gpu, "memory_total_bytes", None),
            getattr(gpu, "memory_free_bytes", None),
            str(getattr(gpu, "name", "GPU")),
            bool(getattr(gpu, "tf32", False)),
            getattr(gpu, "cpu_affinity", None),
        )
    raise UsageError(f"bad device {text!r}; use auto, cpu, cuda or cuda:K")
