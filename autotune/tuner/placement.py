"""Where a search's trials run: the ranks of a DDP trial, or several single-device trials at once.

``--nproc-per-node N`` makes every trial a world of N ranks on one host
(:mod:`autotune.runner.ranks`); ``--devices cuda:0,cuda:1`` (or ``all``, or
``cpu,cpu`` on a CPU host) runs one trial per listed device at the same time
(:mod:`autotune.tuner.parallel`). Either way the usable cores are split into
disjoint, equal shares: a rank, or a parallel trial, gets the share a rank
would have in DDP on this host, the budget it has in the real run.
:func:`place` checks the request against the probe before anything runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from autotune.devices import DeviceInfo, resolve_device
from autotune.errors import UsageError, WorkloadError
from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner import TrialRunner, WindowCallback
from autotune.runner.ranks import share
from autotune.train_setup import TrainSetup
from autotune.units import counted
from probes.cpu import in_topology_order


@dataclass(frozen=True)
class Slot:
    """One place a trial runs: its device and the CPU cores of the whole trial (every rank's)."""

    device: str
    cores: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """How a search's trials are placed.

    Attributes:
        world_size: Ranks per trial (``--nproc-per-node``).
        slots: Where trials run; more than one slot runs trials in parallel.
        device: The device of the first slot, as the probe saw it (the
            workload's device; confirmation runs there), with the least memory
            free among the slots' (or ranks') GPUs: the calibration's budget.
    """

    world_size: int
    slots: tuple[Slot, ...]
    device: DeviceInfo

    @property
    def parallel(self) -> bool:
        """Whether several trials run at the same time."""
        return len(self.slots) > 1

    @property
    def processes(self) -> int:
        """Trial processes running at once: every rank of every parallel trial (they share the host's RAM)."""
        return self.world_size * len(self.slots)

    @property
    def rank_cores(self) -> int:
        """The cores one rank (or one parallel trial) has: its loader workers' budget."""
        return max(1, len(self.slots[0].cores) // self.world_size)

    @property
    def cuda_devices(self) -> tuple[str, ...]:
        """The ``cuda:K`` devices the trials use: every slot's, or one trial's ranks' (rank K on ``cuda:K``)."""
        if self.world_size > 1:
            return tuple(f"cuda:{k}" for k in range(self.world_size)) if self.device.type == "cuda" else ()
        return tuple(dict.fromkeys(slot.device for slot in self.slots if slot.device.startswith("cuda")))

    def rank_batch(self, effective_batch: int | None) -> int | None:
        """One rank's share of a pinned global effective batch (``--effective-batch``)."""
        return effective_batch // self.world_size if effective_batch is not None else None

    def space_args(self, effective_batch: int | None) -> dict[str, Any]:
        """``build_space``'s arguments that follow from the placement: one rank's cores and batch, the world size."""
        return {"usable_cores": self.rank_cores, "effective_batch": self.rank_batch(effective_batch), "world_size": self.world_size}

    def rank_workload(self, workload: Workload) -> Workload:
        """The workload as one rank sees it: its share of the samples (each rank reads every N-th one).

        A step, a batch and a loader queue must fit in one rank's share of an
        epoch, so the space, the calibration and the checks before a trial use it.

        Raises:
            WorkloadError: The data holds fewer samples than there are ranks: one rank would read none (its trials failed
                after the calibration, saying the dataset was empty).
        """
        if workload.images is not None and workload.images < self.world_size:
            raise WorkloadError(f"the data holds {counted(workload.images, 'sample')}, fewer than the {self.world_size} ranks of "
                                f"--nproc-per-node {self.world_size}: each rank reads its own share of them, so one "
                                "would read none; run fewer processes or give more data")
        return workload.rank_share(self.world_size)

    def runner(self, runner: TrialRunner, index: int = 0) -> TrialRunner:
        """``runner`` with its trials placed on slot ``index``."""
        if self.world_size == 1 and not self.parallel:
            return runner
        return PlacedRunner(runner, self.slots[index], self.world_size)

    def describe(self, iterable: bool = False) -> str:
        """One line for the start of a search (``iterable``: the workload's dataset is an ``IterableDataset``)."""
        if self.world_size > 1:
            share = ("an iterable dataset each rank iterates itself, unsharded (samples/s counts every rank's items: "
                     "copies, unless its __iter__ splits the stream by torch.distributed.get_rank())" if iterable
                     else f"1/{self.world_size} of the samples per rank")
            return f"DDP trials: {self.world_size} ranks each ({self.slots[0].device}), {self.rank_cores} CPU core(s) and {share}"
        names = ", ".join(s.device for s in self.slots)
        return f"parallel trials: {len(self.slots)} at a time on {names}, {self.rank_cores} CPU core(s) each"


class PlacedRunner:
    """A trial runner whose trials run on one slot, with the placement's world size."""

    def __init__(self, runner: TrialRunner, slot: Slot, world_size: int) -> None:
        self.inner = runner
        self.slot = slot
        self.world_size = world_size

    def __call__(
        self,
        setup: TrainSetup,
        workload: Workload,
        options: TrialOptions | None = None,
        *,
        on_window: WindowCallback | None = None,
    ) -> TrialResult:
        """Run the trial on this slot's device and cores."""
        options = replace(options or TrialOptions(), world_size=self.world_size, cores=self.slot.cores)
        return self.inner(setup, replace(workload, device=self.slot.device), options, on_window=on_window)


def usable_core_ids(usable: int) -> tuple[int, ...]:
    """The ids of the cores this process may use: its affinity mask, cut to the usable count (cgroup quota), socket by
    socket with each physical core's hyperthreads together (``probes.cpu.in_topology_order``): the contiguous shares
    of parallel trials and ranks are whole cores of one socket."""
    try:
        return in_topology_order(sorted(os.sched_getaffinity(0)), keep=max(1, usable))
    except (AttributeError, OSError):  # no affinity on this system
        return tuple(range(max(1, usable)))


def _devices(text: str, device: str, hardware: Any) -> list[DeviceInfo]:
    """The devices of ``--devices``, resolved against the probe."""
    names = [t.strip() for t in text.split(",")]
    if text.strip().lower() == "all":
        gpus = resolve_device("auto", hardware)
        if gpus.type != "cuda":
            raise UsageError("--devices all: no CUDA GPU found; on a CPU host list cpu,cpu,... to split the cores")
        count = 0
        while True:
            try:
                resolve_device(f"cuda:{count}", hardware)
            except UsageError:
                break
            count += 1
        names = [f"cuda:{k}" for k in range(count)]
    if any(not n for n in names):
        gpu = bool(getattr(hardware, "gpus", None)) and not any(n.strip().lower().startswith("cpu") for n in names)
        raise UsageError(f"--devices {text!r}: an empty entry; use "
                         f"{'cuda:0,cuda:1,... or all' if gpu else 'cpu,cpu,... (one trial per share of the cores)'}")
    try:
        resolved = [resolve_device(n, hardware) for n in names]
    except UsageError as exc:
        hint = "; or all (every GPU)" if str(exc).startswith("bad device") else ""
        raise UsageError(f"--devices {text!r}: {exc}{hint}") from None
    if len({d.type for d in resolved}) > 1:
        raise UsageError(f"--devices {text!r} mixes CPU and CUDA devices; list one kind")
    cuda = [d.name for d in resolved if d.type == "cuda"]
    if len(set(cuda)) < len(cuda):
        raise UsageError(f"--devices {text!r} lists a GPU twice; each parallel trial needs its own GPU")
    if device.strip().lower() != "auto" and resolve_device(device, hardware).name != resolved[0].name:
        raise UsageError(f"--device {device} conflicts with --devices {text}; pass one of them")
    return resolved


def place(device_text: str, devices: str | None, nproc_per_node: int, hardware: Any) -> Placement:
    """Resolve ``--device``, check ``--nproc-per-node`` and ``--devices`` against the probe, split the cores.

    Args:
        device_text: ``--device`` as typed (``auto``, ``cpu``, ``cuda:K``).
        devices: ``--devices`` as typed, or None.
        nproc_per_node: Ranks per trial.
        hardware: The probe's ``Hardware``.

    Raises:
        UsageError: One line naming the problem.
    """
    device = resolve_device(device_text, hardware)
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int):  # the Python API's trial() takes any value
        raise UsageError(f"--nproc-per-node must be an integer, got {nproc_per_node!r}")
    if nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be >= 1, got {nproc_per_node}")
    cores = usable_core_ids(int(hardware.cpu.usable_cores))
    if devices is not None:
        if nproc_per_node > 1:
            raise UsageError("--devices runs single-device trials in parallel; it cannot be combined with --nproc-per-node")
        listed = _devices(devices, device_text, hardware)
        if len(listed) > len(cores):
            raise UsageError(f"--devices lists {len(listed)} devices but only {len(cores)} CPU cores are usable")
        cores = near_first(cores, [d.near_cpus for d in listed])
        slots = tuple(Slot(d.name, share(cores, len(listed), k)) for k, d in enumerate(listed))
        return Placement(1, slots, tightest(listed))
    if nproc_per_node > 1:
        if device.name not in ("cpu", "cuda:0"):
            raise UsageError(
                f"--device {device_text} --nproc-per-node {nproc_per_node}: rank K trains on cuda:K, as under torchrun; "
                "choose the GPUs with CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=2,3) and pass --device cuda"
            )
        if device.type == "cuda":
            gpus = sum(1 for k in range(nproc_per_node) if _present(f"cuda:{k}", hardware))
            if gpus < nproc_per_node:
                raise UsageError(f"--nproc-per-node {nproc_per_node}: only {gpus} GPU(s) present, one per rank needed")
        if nproc_per_node > len(cores):
            raise UsageError(
                f"--nproc-per-node {nproc_per_node}: only {len(cores)} CPU core(s) usable, each rank needs one"
            )
        first = resolve_device("cuda:0", hardware) if device.type == "cuda" else device
        ranks = [resolve_device(f"cuda:{k}", hardware) for k in range(nproc_per_node)] if device.type == "cuda" else [first]
        cores = near_first(cores, [d.near_cpus for d in ranks]) if device.type == "cuda" else cores
        return Placement(nproc_per_node, (Slot(first.name, cores),), tightest(ranks))
    return Placement(1, (Slot(device.name, cores),), device)  # one plain trial at a time: not pinned


def near_first(cores: tuple[int, ...], near: list[tuple[int, ...] | None]) -> tuple[int, ...]:
    """``cores`` reordered so that ``share(cores, len(near), k)`` (``runner.ranks.share``: the k-th parallel trial's or
    rank's cores) holds, as far as they go, cores that NVML names as nearest GPU k: on a machine of two sockets, a trial
    on a GPU of the second socket gets that socket's cores, not the first's, which every read of its pinned memory and
    every loader batch would cross the socket link for. Each share keeps its size; a GPU whose near cores are taken
    fills its share from the rest in topology order. Unchanged where NVML names no GPU's near cores, or the same ones
    for every GPU (one socket).

    Args:
        cores: The usable cores in topology order (``usable_core_ids``).
        near: Each GPU's near CPUs in device order (``DeviceInfo.near_cpus``), None where unknown.
    """
    if not near or all(n is None for n in near) or len({n for n in near}) == 1:
        return cores
    sizes = [len(share(cores, len(near), k)) for k in range(len(near))]
    left = list(cores)
    picked: list[list[int]] = []
    for size, cpus in zip(sizes, near, strict=True):
        close = set(cpus or ())
        mine = [c for c in left if c in close][:size]
        picked.append(mine)
        left = [c for c in left if c not in mine]
    for mine, size in zip(picked, sizes, strict=True):  # the shares a GPU's own cores could not fill, in topology order
        need = size - len(mine)
        mine.extend(left[:need])
        left = left[need:]
    return tuple(c for mine in picked for c in mine)


def tightest(devices: list[DeviceInfo]) -> DeviceInfo:
    """The first device, with the least memory free among ``devices`` (GPUs whose free memory NVML reads): the memory
    budget of trials that run on any of them (parallel slots, or one trial's ranks) holds on the busiest card."""
    known = [d.memory_free_bytes for d in devices if d.memory_free_bytes is not None]
    return replace(devices[0], memory_free_bytes=min(known)) if known and devices[0].memory_free_bytes is not None else devices[0]


def _present(name: str, hardware: Any) -> bool:
    try:
        resolve_device(name, hardware)
    except UsageError:
        return False
    return True
