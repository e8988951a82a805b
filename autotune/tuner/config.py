"""What a search takes (:class:`SearchConfig`) and gives back (:class:`SearchOutcome`)."""

from __future__ import annotations

import math
import numbers
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from autotune.errors import StorageError, UsageError, check_bool
from autotune.output.best import Best
from autotune.records import DEFAULT_TRIAL_SECONDS, MAX_SECONDS, Calibration, TrialRecord, TrialResult
from autotune.redact import hide_url_password
from autotune.rounds import Ceilings, Confirmed
from autotune.time_spent import Phase, TimeSpent
from autotune.tuner.constraints import Constraint, merge_constraints, parse_constraint
from autotune.tuner.storage_urls import is_shared
from autotune.units import as_float, parse_size

#: The shortest ``--trial-seconds`` a user may ask for: shorter windows measure the loader's prefetched
#: queue, not its steady rate (0.001 s once reported 3.35x the defaults, above the loader's own ceiling).
MIN_TRIAL_SECONDS = 0.5


def check_timeout(timeout_s: float | None, trial_seconds: float) -> float | None:
    """``timeout_s`` as a Python float (NumPy's numbers too); refuse one outside (0, :data:`MAX_SECONDS`] (NaN too), or
    one every trial would reach.

    A trial measures ``trial_seconds`` after its start-up, so a timeout no longer than that kills every trial.

    Raises:
        UsageError: With a one-line reason.
    """
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise UsageError(f"--timeout must be a number, got {timeout_s!r}")
    if not 0 < timeout_s <= MAX_SECONDS:
        raise UsageError(f"--timeout must be > 0 and <= {MAX_SECONDS:.0f}, got {timeout_s}")
    if timeout_s <= trial_seconds:
        raise UsageError(f"--timeout {timeout_s:g} must be longer than --trial-seconds {trial_seconds:g}: a trial measures "
                         "that long after its start-up, so every trial would time out")
    return as_float(timeout_s)


#: The most synthetic JPEGs a search or trial writes (about 5 GiB: see workloads.data.SYNTHETIC_JPEG_BYTES).
MAX_SYNTHETIC_IMAGES = 100_000


def check_trial_seconds(value: float) -> float:
    """``value`` as a Python float (NumPy's numbers too); refuse a ``--trial-seconds`` outside [:data:`MIN_TRIAL_SECONDS`,
    :data:`MAX_SECONDS`] (NaN too).

    Raises:
        UsageError: With a one-line reason.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"--trial-seconds must be a number, got {value!r}")
    if not MIN_TRIAL_SECONDS <= value <= MAX_SECONDS:
        raise UsageError(f"--trial-seconds must be >= {MIN_TRIAL_SECONDS:g} and <= {MAX_SECONDS:.0f}, got {value}")
    return as_float(value)


def check_synthetic_images(count: int | None, data: object) -> None:
    """Refuse a ``--synthetic-images`` outside 16..:data:`MAX_SYNTHETIC_IMAGES`, or given with ``--data`` (where no
    synthetic JPEGs are made: it would be ignored); ``None`` is "not set".

    Raises:
        UsageError: With a one-line reason.
    """
    if count is None:
        return
    if data is not None:
        raise UsageError("--synthetic-images sizes the synthetic JPEGs made without --data; leave one of them out")
    if isinstance(count, bool) or not isinstance(count, int) or not 16 <= count <= MAX_SYNTHETIC_IMAGES:
        raise UsageError(f"--synthetic-images must be between 16 and {MAX_SYNTHETIC_IMAGES}, got {count!r}")


def path_of(flag: str, value: object) -> Path:
    """``value`` as a Path; the Python API takes any value where the CLI's Typer gave a path.

    Raises:
        UsageError: ``value`` is neither a str nor an os.PathLike (None, a number, bytes), or is empty.
    """
    if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
        raise UsageError(f"{flag} must be a path (a str or os.PathLike), got {value!r}")
    if not os.fspath(value):  # Path("") is the current directory
        raise UsageError(f"{flag} must not be empty (write . for the current directory)")
    try:
        return Path(value).expanduser()  # ~ as a shell expands it, not a folder named ~
    except RuntimeError:  # ~nosuchuser, or no home directory to read
        raise UsageError(f"{flag} {os.fspath(value)}: its ~ names no home directory here; write the path out") from None


def parse_max_memory(value: object) -> int | None:
    """``--max-memory`` (``max_memory=``) in bytes: an integer (NumPy's as Python's, stored as JSON), a size text
    (``"20GiB"``) or None.

    Raises:
        UsageError: Anything else (a bool, a float, a list), or a text that is no size.
    """
    if isinstance(value, str):
        return parse_size(value)
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise UsageError(f"--max-memory must be bytes (an integer) or a size such as '20GiB', got {value!r}")
    return None if value is None else int(value)


#: The numeric and text fields of :class:`SearchConfig` and the type each must have: Python's own, as they are stored as JSON.
_TYPES: dict[str, type | tuple[type, ...]] = {
    "trials": int, "image_size": int, "effective_batch": int, "seed": int, "synthetic_images": int, "confirm_top": int,
    "confirm_rounds": int, "nproc_per_node": int, "timeout_s": (int, float), "lr": (int, float),
    "model": str, "study": str, "storage": str, "devices": str, "command": str, "sampler": str,
}  # trial_seconds: check_trial_seconds, which trial() calls too
#: Fields whose None means "not set".
_OPTIONAL = ("effective_batch", "timeout_s", "study", "storage", "devices", "synthetic_images")
#: The abstract number each numeric type takes (NumPy's and Python's alike), turned into Python's own before it is stored.
_NUMBERS: dict[type | tuple[type, ...], type] = {int: numbers.Integral, (int, float): numbers.Real}
#: How a refusal names each type.
_TYPE_NAMES: dict[type | tuple[type, ...], str] = {int: "an integer", str: "a string", (int, float): "a number"}


#: Most trials a search takes: at 5 s each, over a week of measuring (a larger number is a typo).
MAX_TRIALS = 100_000

@dataclass(frozen=True)
class SearchConfig:
    """Everything ``autotune search`` takes.

    Attributes:
        model: torchvision name or ``package.module:function`` (the
            image-classifier shorthand, resnet50 by default; ignored with ``workload``).
        trials: Finished trials wanted in the study, in total (resume included; 30 by default).
        image_size: Crop size fed to the model.
        data: ImageFolder directory, or None for synthetic JPEGs.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:K``.
        effective_batch: Pin micro-batch x accumulation to this value.
        max_memory: Memory budget in bytes.
        trial_seconds: Measured seconds per trial.
        constraints: The user's ``--set`` pins and bounds: ``Constraint`` objects or ``KNOB=VALUE`` strings
            (``"amp=bf16"``, ``"batch_size=32..256"``), the strings parsed by :meth:`validate`.
        out: Output directory.
        study: Study name (default derived from the workload).
        storage: Optuna storage URL (default SQLite in ``out``).
        seed: Sampler seed.
        sampler: ``tpe`` (default) or ``random`` (a baseline for comparisons).
        cache_dir: Synthetic data cache.
        synthetic_images: Files in the synthetic dataset (None: 2000 on a
            CPU, 16384 on CUDA, :func:`~autotune.workloads.data.default_synthetic_images`).
        confirm_top: Finalists re-measured.
        confirm_rounds: Most interleaved rounds of re-measurement (fewer
            when the ranking settles after two).
        lr: Learning rate at the reference batch.
        timeout_s: Per-trial timeout (None: derived from trial_seconds).
        command: The command line, for the record.
        ceilings: Measure the winner computing alone and loading alone
            after confirmation, for a like-for-like bottleneck verdict (the
            benchmarks, which compare picks and not verdicts, turn it off).
        workload: The user's workload factory, ``"package.module:function"``
            or the function itself, returning an :class:`autotune.Task`;
            ``None`` for the classifier shorthand. With a workload, ``lr``
            comes from the Task and ``image_size``, ``data``,
            ``synthetic_images`` and ``cache_dir`` do not apply.
        nproc_per_node: Ranks per trial: DDP trials under torch.distributed
            when > 1 (gloo on a CPU, nccl on CUDA); ``--effective-batch`` is
            then micro-batch x accumulation x ranks.
        devices: ``--devices``: ``cuda:0,cuda:1,...``, ``all`` or
            ``cpu,cpu,...``; one trial per device at the same time.
    """

    model: str = "resnet50"  # the classifier shorthand's (a workload's Task replaces it)
    trials: int = 30
    image_size: int = 224
    data: Path | None = None
    device: str = "auto"
    effective_batch: int | None = None
    max_memory: int | None = None
    trial_seconds: float = DEFAULT_TRIAL_SECONDS
    constraints: tuple[Constraint, ...] = ()
    out: Path = Path("autotune-out")
    study: str | None = None
    storage: str | None = None
    seed: int = 0
    sampler: str = "tpe"
    cache_dir: Path | None = None
    synthetic_images: int | None = None
    confirm_top: int = 3
    confirm_rounds: int = 4
    lr: float = 1e-3
    timeout_s: float | None = None
    command: str = ""
    workload: str | Callable[..., Any] | None = None
    ceilings: bool = True
    nproc_per_node: int = 1
    devices: str | None = None

    @property
    def pins(self) -> dict[str, Constraint]:
        """The ``--set`` constraints by knob.

        Raises:
            UsageError: A knob is given twice.
        """
        return merge_constraints(self.constraints)

    def validate(self) -> None:
        """Reject bad values before anything runs or is written, and normalize the rest in place (the frozen fields
        set through ``object.__setattr__``): paths as ``Path``, ``max_memory`` in bytes, ``constraints`` parsed, the
        sampler's name lowercased, NumPy numbers as Python's. :attr:`pins` reads the parsed constraints: call this first.

        Raises:
            UsageError: With a one-line reason.
        """
        # The paths and the memory budget as autotune.search() takes them (str paths, "20GiB"): the config-object form.
        for name in ("data", "out", "cache_dir"):
            if getattr(self, name) is not None or name == "out":
                object.__setattr__(self, name, path_of(f"--{name.replace('_', '-')}", getattr(self, name)))
        object.__setattr__(self, "max_memory", parse_max_memory(self.max_memory))
        for name, kind in _TYPES.items():  # the Python API takes what Typer would have parsed
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            number = _NUMBERS.get(kind)  # NumPy's integers and floats too (a config read through NumPy or pandas)
            if not isinstance(value, bool) and number is not None and isinstance(value, number) and not isinstance(value, kind):
                value = int(value) if isinstance(value, numbers.Integral) else as_float(value)
                object.__setattr__(self, name, value)  # stored as JSON: Python's own type
            if isinstance(value, bool) or not isinstance(value, kind):
                raise UsageError(f"--{name.removesuffix('_s').replace('_', '-')} must be {_TYPE_NAMES[kind]}, got {value!r}")
        check_bool("--ceilings", self.ceilings)  # "no" is truthy: two more runs the caller turned off
        if isinstance(self.constraints, (str, Constraint)) or not isinstance(self.constraints, (tuple, list)):
            raise UsageError(f"--set: constraints must be a list of KNOB=VALUE strings, got {self.constraints!r}")
        if bad := [c for c in self.constraints if not isinstance(c, (str, Constraint))]:
            raise UsageError(f"--set: each constraint is a KNOB=VALUE string (amp=bf16), got {bad[0]!r}")
        object.__setattr__(self, "constraints", tuple(parse_constraint(c) if isinstance(c, str) else c for c in self.constraints))
        if not 1 <= self.trials <= MAX_TRIALS:
            raise UsageError(f"--trials must be between 1 and {MAX_TRIALS}, got {self.trials}")
        if self.effective_batch is not None and self.effective_batch < 1:
            raise UsageError(f"--effective-batch must be >= 1, got {self.effective_batch}")
        object.__setattr__(self, "trial_seconds", check_trial_seconds(self.trial_seconds))
        object.__setattr__(self, "timeout_s", check_timeout(self.timeout_s, self.trial_seconds))
        if not 0 < self.lr < math.inf:
            raise UsageError(f"--lr must be a finite number > 0, got {self.lr}")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed must be between 0 and 2**32 - 1, got {self.seed}")
        check_synthetic_images(self.synthetic_images, self.data)
        for flag, value in (("--study", self.study), ("--storage", self.storage)):
            if value is not None and not value.strip():
                raise UsageError(f"{flag} must not be empty (leave it out for the default)")
        if self.max_memory is not None and self.max_memory <= 0:
            raise UsageError(f"--max-memory must be > 0, got {self.max_memory}")
        if not self.model.strip():
            raise UsageError("--model must not be empty")
        if self.cache_dir is not None and self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise StorageError(f"--cache-dir {self.cache_dir} is not a directory")  # what a well-formed path names: exit 1, as --out
        for flag, count in (("--confirm-top", self.confirm_top), ("--confirm-rounds", self.confirm_rounds)):
            if count < 1:
                raise UsageError(f"{flag} must be >= 1, got {count}")
        object.__setattr__(self, "sampler", self.sampler.lower())  # as --amp BF16 and --device CPU are read
        if self.sampler not in ("tpe", "random"):
            raise UsageError(f"--sampler must be tpe or random, got {self.sampler!r}")
        if self.workload is None and self.image_size < 8:
            raise UsageError(f"--image-size must be >= 8, got {self.image_size}")
        if self.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if self.effective_batch is not None and self.effective_batch % self.nproc_per_node:
            raise UsageError(
                f"--effective-batch {self.effective_batch} is not a multiple of --nproc-per-node {self.nproc_per_node}"
            )
        if self.effective_batch is not None and "accumulation_steps" in self.pins:
            raise UsageError("--effective-batch fixes accumulation_steps; do not --set it as well")
        if self.devices is not None and is_shared(self.storage):  # a worker's loop runs one trial at a time, on the first slot
            raise UsageError(
                f"--devices {self.devices} runs parallel trials in one search, not in a worker of a shared study (--storage "
                f"{hide_url_password(str(self.storage))}), whose trials run one at a time: start one worker per device instead "
                "(--device cuda:K, each with its own --out; on a CPU host, each pinned to its cores with taskset)"
            )


@dataclass
class Timing:
    """Where the time of a search went (this invocation only).

    Attributes:
        wall_s: Wall time of :func:`run_search`.
        measured_s: Steady-state windows measured, summed over every trial
            run (calibration, search trials, confirmation).
        runs: Trial runs (a held finalist's rounds each count, :class:`~autotune.runner.held.HeldTrials`).
        phase: The step now running; each trial process counts toward it.
        spent: The breakdown by step (its ``wall_s`` is set by :meth:`record`).
    """

    wall_s: float = 0.0
    measured_s: float = 0.0
    runs: int = 0
    phase: Phase = "calibration"
    spent: TimeSpent = field(default_factory=TimeSpent)
    #: ``--devices`` runs trials in threads that account concurrently.
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def add(self, result: TrialResult, wall_s: float) -> None:
        """Account one trial process that took ``wall_s`` seconds to the current phase (thread-safe)."""
        with self._lock:
            self.runs += 1
            self.measured_s += result.measured_s or 0.0
            self.spent = self.spent.with_trial(self.phase, result, wall_s)

    def record(self) -> TimeSpent:
        """The breakdown with this invocation's wall time."""
        return replace(self.spent, wall_s=self.wall_s)


@dataclass(frozen=True)
class SearchOutcome:
    """What a search produced.

    Attributes:
        best: The winner (also written as best.json). :func:`~autotune.tuner.run.run_search` raises
            rather than return none; a report of a study still running has none yet.
        records: Every finished trial.
        confirmed: The confirmation measurements (after an interrupt, the rounds measured so far, unranked).
        calibration: The pre-search measurements.
        verdict: Which side limits the training speed, in words.
        out: Output directory.
        storage: Storage URL of the study.
        study: Study name.
        interrupted: True if Ctrl-C stopped the search.
        files: The files written (report.html and its PNG copies included).
        timing: Where this invocation's time went.
        ceilings: The winner's compute-only and loader-only rates, measured
            beside it for the verdict (None when not measured).
        time_spent: Where the time of every run of the study went (the report's breakdown).
    """

    best: Best | None
    records: tuple[TrialRecord, ...]
    confirmed: tuple[Confirmed, ...]
    calibration: Calibration
    verdict: str
    out: Path
    storage: str
    study: str
    interrupted: bool = False
    files: tuple[str, ...] = field(default_factory=tuple)
    timing: Timing | None = None
    ceilings: Ceilings | None = None
    time_spent: TimeSpent | None = None

    def to_dict(self) -> dict[str, Any]:
        """The final summary as JSON (``--json``)."""
        return {
            "best": self.best.to_dict() if self.best else None,
            "verdict": self.verdict,
            "interrupted": self.interrupted,
            "out": str(self.out),
            "storage": self.storage,
            "study": self.study,
            "files": list(self.files),
            "timing": {**asdict(self.timing), "spent": asdict(self.timing.record())} if self.timing else None,
            "ceilings": self.ceilings.to_dict() if self.ceilings else None,
            "time_spent": asdict(self.time_spent) if self.time_spent else None,
            "calibration": self.calibration.to_dict(),
            "confirmation": [c.to_dict() for c in self.confirmed],
            "trials": [r.to_dict() for r in self.records],
        }
