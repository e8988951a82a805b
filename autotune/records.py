"""Plain records that cross a process boundary or are stored, each a frozen dataclass with ``to_dict``/``from_dict``.

A trial's request (:class:`Workload`, :class:`TrialOptions`, the setup) and its :class:`TrialResult` travel as
JSON; the study stores results and the :class:`Calibration` as JSON user attributes (the confirmation's records are
in :mod:`autotune.rounds`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from autotune.devices import device_type
from autotune.errors import UsageError
from autotune.train_setup import TrainSetup
from autotune.units import counted

#: Share above the compute-only rate a loader must deliver to keep the device fed despite its jitter.
LOADER_MARGIN = 1.25
#: How a learning rate follows the effective batch: square root (adaptive optimizers), linear (SGD-like) or not at all
#: (sign-based or parameter-free ones: kept).
LR_SCALINGS = ("sqrt", "linear", "none")
#: Workload fields of the image-classifier shorthand only: a Task brings its own data.
SHORTHAND_ONLY = ("image_size", "data", "synthetic_images", "cache_dir")
#: The longest trial or timeout accepted (a day): ``inf`` or a typo would never end.
MAX_SECONDS = 86400.0
#: Measured seconds per trial unless asked otherwise (``python -m benchmarks.fidelity compare`` measured 5 against 10).
DEFAULT_TRIAL_SECONDS = 5.0


@dataclass(frozen=True)
class Workload:
    """What a trial trains.

    Attributes:
        model: A torchvision classification model name (``"resnet50"``) or a user factory ``"package.module:function"`` returning an nn.Module.
        image_size: Side of the square crop fed to the model (a Task's data is its own: unused, and left out of :meth:`to_dict`).
        data: An ImageFolder directory, or ``None`` for synthetic JPEGs.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:K"`` (already resolved).
        num_classes: Classes in the data (filled in from the data).
        images: Training images in the data (filled in from the data); an optimizer step must fit in one epoch of them.
        lr: AdamW learning rate at the reference effective batch.
        synthetic_images: Files in the synthetic dataset (when ``data`` is None).
        cache_dir: Where synthetic data is generated (``None``: the default cache).
        sys_path: Extra import paths for a user factory (the caller's cwd).
        task: A workload factory ``"package.module:function"`` returning an :class:`autotune.Task`, or ``None`` for the
            image-classifier shorthand (``model``, ``image_size``, ``data``). With a task, ``model`` repeats the reference
            and ``images`` is ``len(dataset)``.
        reference_batch: The Task's recipe batch (the reference effective batch); ``None``: the PyTorch default of 32.
        image_input: Whether batches hold a 4-D floating tensor, the only case where ``channels_last`` applies.
        iterable: Whether the Task's dataset is an ``IterableDataset``.
        lr_scaling: How the learning rate follows the effective batch: ``"sqrt"`` for adaptive (Adam-family) optimizers,
            the default AdamW included; ``"linear"`` for SGD-like ones; ``"none"`` (kept) for sign-based or parameter-free ones.
        fixed_shapes: Whether every batch has the same shapes (cuDNN autotuning is safe); the classifier's crops always do.
        own_optimizer: Whether a Task brings its own optimizer factory (``optimizer_impl`` is then not offered).
        unsharded: An iterable dataset that every loader worker yields whole: one worker at most.
        parameters: Trainable parameters of a Task's model (a changed model is another search).
        precision: A Task's model's floating parameters' dtype when not float32 (``"float64"``, ``"float16"``, ``"bfloat16"``;
            several joined by ``+``): no autocast is searched for float64 alone (autocast leaves it alone), no fp16 beside
            16-bit parameters (:mod:`autotune.tuner.offered`). Left out of :meth:`to_dict` when None.
        batch_norm: Whether the model holds a BatchNorm layer that trains (not left in eval mode); None: not known. Left out when None.
        compiled: Whether a Task's factory returns a model ``torch.compile`` wrapped: it compiles in every setup, so the
            ``compile`` knob is not offered (:mod:`autotune.tuner.offered`). Left out when None.
    """

    model: str
    image_size: int = 224
    data: str | None = None
    device: str = "cpu"
    num_classes: int | None = None
    images: int | None = None
    lr: float = 1e-3
    synthetic_images: int = 2000
    cache_dir: str | None = None
    sys_path: tuple[str, ...] = field(default_factory=tuple)
    task: str | None = None
    lr_scaling: str = "sqrt"
    reference_batch: int | None = None
    image_input: bool = True
    iterable: bool = False
    fixed_shapes: bool = True
    own_optimizer: bool = False
    unsharded: bool = False
    parameters: int | None = None
    precision: str | None = None
    batch_norm: bool | None = None
    compiled: bool | None = None

    def __post_init__(self) -> None:
        if self.lr_scaling not in LR_SCALINGS:
            raise UsageError(f"lr_scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}")
        if not isinstance(self.image_size, int) or self.image_size < 8:
            raise UsageError(f"the image size (--image-size) must be an integer >= 8, got {self.image_size!r}")
        if self.synthetic_images < 16:
            raise UsageError(f"synthetic_images must be >= 16, got {self.synthetic_images}")
        if self.images is not None and self.images < 1:
            raise UsageError(f"images must be >= 1, got {self.images}")
        if not self.lr > 0:
            raise UsageError(f"learning rate must be > 0, got {self.lr}")
        if self.reference_batch is not None and self.reference_batch < 1:
            raise UsageError(f"reference batch must be >= 1, got {self.reference_batch}")

    def describe(self, world_size: int = 1) -> str:
        """One line: what is trained, on which device, from which data (a Task's samples: one of ``world_size`` ranks')."""
        if self.task is not None:
            share = " per rank" if world_size > 1 else ""
            size = f"{counted(self.images, 'sample')}{share}" if self.images is not None else "an iterable dataset"
            return f"workload {self.task} on {self.device}, {size}"
        data = self.data or "synthetic JPEGs (no --data given)"
        return f"{self.model} @ {self.image_size}px on {self.device}, data: {data}"

    @property
    def device_type(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return device_type(self.device)

    def rank_share(self, world_size: int) -> Workload:
        """The workload as one of ``world_size`` ranks sees it: its share of the samples (each rank reads every N-th one)."""
        if world_size <= 1 or self.images is None:
            return self
        return replace(self, images=max(1, self.images // world_size))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; a Task's leaves out the shorthand's data fields (its data is its own: a crop size would mean nothing),
        and one with ``--data`` the synthetic image count it does not use."""
        data = asdict(self)
        data["sys_path"] = list(self.sys_path)
        if self.task is not None:
            for name in SHORTHAND_ONLY:
                del data[name]
        elif self.data is not None:
            del data["synthetic_images"]
        for name in ("precision", "batch_norm", "compiled"):
            if data[name] is None:  # as versions before the field wrote it (their readers check the keys)
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        """Inverse of :meth:`to_dict`; a Task's shorthand fields (earlier versions wrote their unused defaults) are not read."""
        data = {**data, "sys_path": tuple(data.get("sys_path", ()))}
        if data.get("task") is not None:
            for name in SHORTHAND_ONLY:
                data.pop(name, None)
        return cls(**data)


Status = Literal["ok", "oom", "timeout", "error", "diverged", "pruned", "interrupted", "bad_data"]
Mode = Literal["train", "compute", "loader"]
FEASIBLE = "ok"


@dataclass(frozen=True)
class TrialOptions:
    """How a trial measures.

    Attributes:
        trial_seconds: Length of the steady-state measurement.
        windows: Number of windows the measurement is split into.
        timeout_s: Wall-clock limit of the whole child, start-up included (``None``: 90 s + 6 x ``trial_seconds``).
        max_memory_bytes: Memory budget; a peak above it is an ``oom``.
        mode: ``train`` (the real loop), ``compute`` (one batch already on the device, no loader) or ``loader`` (the loader alone, no model).
        seed: Seed for model initialisation and sampling.
        world_size: Ranks of the trial (DDP under torch.distributed when > 1).
        cores: CPU cores of the trial, split among its ranks (empty: not pinned).
    """

    trial_seconds: float = DEFAULT_TRIAL_SECONDS
    windows: int = 5
    timeout_s: float | None = None
    max_memory_bytes: int | None = None
    mode: Mode = "train"
    seed: int = 0
    world_size: int = 1
    cores: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.trial_seconds <= MAX_SECONDS:
            raise UsageError(f"trial seconds must be > 0 and <= {MAX_SECONDS:.0f}, got {self.trial_seconds}")
        if self.windows < 1:
            raise UsageError(f"windows must be >= 1, got {self.windows}")
        if self.timeout_s is not None and not 0 < self.timeout_s <= MAX_SECONDS:
            raise UsageError(f"timeout must be > 0 and <= {MAX_SECONDS:.0f}, got {self.timeout_s}")
        if self.max_memory_bytes is not None and self.max_memory_bytes <= 0:
            raise UsageError(f"max memory must be > 0, got {self.max_memory_bytes}")
        if self.mode not in ("train", "compute", "loader"):
            raise UsageError(f"unknown trial mode {self.mode!r}; modes: train, compute (no loader) or loader (no model)")
        if self.world_size < 1 or (self.cores and len(self.cores) < self.world_size):
            raise UsageError(f"{self.world_size} ranks need >= 1 rank and a core each, got cores {self.cores}")
        object.__setattr__(self, "cores", tuple(self.cores))

    @property
    def effective_timeout_s(self) -> float:
        """The timeout in force."""
        return self.timeout_s if self.timeout_s is not None else 90.0 + 6.0 * self.trial_seconds


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured. The JSON keys are a contract.

    Attributes:
        status: ``ok``, ``oom``, ``timeout``, ``error``, ``diverged`` (or ``pruned`` when a search
            stopped it early; ``interrupted`` when something outside terminated it; ``bad_data`` when a data file
            cannot be decoded or an item raises in ``compute`` mode's batch: neither is the setup's failure, nor stored).
        samples_per_s: Median steady-state window throughput (with accumulation: samples over the whole steps; pruned: the median of its windows),
            at most ``loader_samples_per_s``.
        samples_per_s_spread: Range (max - min) of the window throughputs.
        step_time_s: Wall time of one optimizer step (``accumulation_steps``
            micro-batches) at the median throughput.
        data_wait_fraction: Share of measured wall time the loop blocked on
            the DataLoader.
        peak_memory_bytes: CUDA: peak reserved by the caching allocator. CPU:
            peak of what the trial process and its loader workers would hold as a run of their own (the trial's RSS, or
            the trial server's imports and its USS, plus each worker's USS), sampled every 50 ms (measure.tree_memory).
        warmup_s: Start-up and warm-up time, excluded from the measurement.
        compile_s: Of the warm-up, the first step with ``torch.compile``
            (compilation included); ``None`` when the model ran eagerly.
        num_threads: ``torch.get_num_threads()`` in the training process.
        other_cores: Cores other processes (or the hypervisor) kept busy during the windows
            (:class:`autotune.runner.measure.LoadMeter`); ``None`` where unknown.
        loader_samples_per_s: Samples/s the loader's workers make when all are busy, each timing its own batches
            (:mod:`autotune.workloads.production`); no window counts more. ``None`` without workers, for an iterable
            dataset, and in results stored before it was measured.
        measured_s: Wall time of the measured windows.
        error: One line saying what went wrong, or ``None``.
        windows: Each window's throughput, in order.
        samples: Samples processed in the measured windows.
        mode: ``train``, ``compute`` or ``loader``.
    """

    status: Status
    samples_per_s: float | None = None
    samples_per_s_spread: float | None = None
    step_time_s: float | None = None
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    warmup_s: float | None = None
    measured_s: float | None = None
    error: str | None = None
    windows: tuple[float, ...] = field(default_factory=tuple)
    samples: int = 0
    mode: str = "train"
    compile_s: float | None = None
    num_threads: int | None = None
    other_cores: float | None = None
    loader_samples_per_s: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the trial measured a throughput."""
        return self.status == FEASIBLE

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        data = asdict(self)
        data["windows"] = list(self.windows)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data["windows"] = tuple(data.get("windows", ()))
        return cls(**data)


@dataclass(frozen=True)
class MemoryPoint:
    """Peak memory and speed of the compute step at one batch size."""

    batch_size: int
    status: str
    peak_bytes: int | None
    samples_per_s: float | None


@dataclass(frozen=True)
class LoaderPoint:
    """What the DataLoader alone delivers with a worker count."""

    num_workers: int
    status: str
    samples_per_s: float | None


@dataclass(frozen=True)
class PrecisionPoint:
    """Compute-only speed of one precision and memory layout, at the probe batch."""

    amp: str
    channels_last: bool
    status: str
    samples_per_s: float | None


@dataclass(frozen=True)
class Calibration:
    """Everything measured before the search.

    Attributes:
        budget_bytes: Memory the model side may use (after reserves).
        max_batch: Largest power-of-two micro-batch that fits and can be
            measured within a trial.
        memory_points: The pre-pass measurements.
        probe_batch: Batch used for the ceilings below.
        compute_setup: Setup of the fastest compute-only measurement.
        compute_samples_per_s: What the device consumes, data already there
            (the fastest precision and layout).
        loader: What the loader delivers per worker count.
        max_workers: Upper bound for ``num_workers`` in the space.
        precisions: Compute-only speed of every precision and layout the
            device offers, like for like at ``probe_batch``.
        stream_batch: The largest batch an iterable dataset fills, when its stream is too short for the largest batch
            the memory allows (``None``: not bounded by the stream); the PyTorch defaults' batch when their own is larger.
        batch_limit: Why no batch above ``max_batch`` is searched, in words
            (the memory budget, the trial's length, the data); "" where a
            calibration of an earlier version did not record it.
        batch_bound: Which bound that is: ``data``, ``trial``, ``cap``,
            ``memory``, ``stream``, or ``failed`` (a pre-pass run); "" unknown.
        torch_threads: Torch's own thread count in a trial (its compute-only runs'); None where not measured.
    """

    budget_bytes: int | None
    max_batch: int
    memory_points: tuple[MemoryPoint, ...]
    probe_batch: int
    compute_setup: TrainSetup
    compute_samples_per_s: float | None
    loader: tuple[LoaderPoint, ...]
    max_workers: int
    precisions: tuple[PrecisionPoint, ...] = ()
    stream_batch: int | None = None
    batch_limit: str = ""
    batch_bound: str = ""
    torch_threads: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (asdict turns the nested points and the setup into dicts)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data["compute_setup"] = TrainSetup.from_dict(data["compute_setup"])
        data["memory_points"] = tuple(MemoryPoint(**p) for p in data["memory_points"])
        data["loader"] = tuple(LoaderPoint(**p) for p in data["loader"])
        data["precisions"] = tuple(PrecisionPoint(**p) for p in data.get("precisions", ()))
        return cls(**data)

    def fastest_precision(self) -> PrecisionPoint | None:
        """The precision and layout that computed fastest, or None if none was measured."""
        measured = [p for p in self.precisions if p.status == "ok" and p.samples_per_s]
        return max(measured, key=lambda p: p.samples_per_s or 0.0) if measured else None

    def precision_of(self, setup: TrainSetup) -> PrecisionPoint | None:
        """The compute-only point measured at ``setup``'s precision and layout (like for like), or None."""
        return next((p for p in self.precisions if p.samples_per_s and (p.amp, p.channels_last) == (setup.amp, setup.channels_last)), None)

    def loader_rate(self, workers: int) -> float | None:
        """What the loader delivered alone with ``workers`` workers (0: in the training process); None if not measured."""
        return next((p.samples_per_s for p in self.loader if p.num_workers == workers and p.status == "ok" and p.samples_per_s), None)

    def fastest_loader(self, within: int | None = None) -> LoaderPoint | None:
        """The loader-only point that delivered most, with at most ``within`` workers (None: any count)."""
        points = [p for p in self.loader if p.samples_per_s and (within is None or p.num_workers <= within)]
        return max(points, key=lambda p: p.samples_per_s or 0.0, default=None)

    def workers_enough(self) -> int | None:
        """Fewest loader workers whose loader-only rate covers the device (at least :data:`LOADER_MARGIN` x the
        compute-only rate); None when the compute rate is unknown or no worker count reached it."""
        target = self.compute_samples_per_s
        if not target:
            return None
        enough = [p.num_workers for p in self.loader if p.samples_per_s and p.samples_per_s >= LOADER_MARGIN * target]
        return min(enough) if enough else None


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial of a study."""

    number: int
    role: str
    setup: TrainSetup
    result: TrialResult
    reused_from: int | None = None
    free: bool = False  # nothing ran: a setup measured before (``reused_from``) or one the data or /dev/shm cannot feed

    @property
    def ran(self) -> bool:
        """Whether this trial ran and measured its figures: not a repeat (its earlier trial's figures) nor a setup not run."""
        return not self.free and self.reused_from is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"number": self.number, "role": self.role, "setup": self.setup.to_dict(), "result": self.result.to_dict(),
                "reused_from": self.reused_from, "free": self.free}
