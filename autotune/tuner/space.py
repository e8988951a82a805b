"""The search space: which values each knob may take, and how Optuna samples it.

The space comes from the probe and the calibration measurements, never from
rules of thumb: ``num_workers`` runs up to the cores this process may use,
the batch sizes up to the largest that fits the memory budget, ``amp`` offers
only the precisions the device runs natively. Users pin or bound any knob
with ``--set``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.devices import DeviceInfo
from autotune.errors import UsageError
from autotune.records import Calibration
from autotune.train_setup import DDP_KNOBS, KNOBS, TrainSetup
from autotune.tuner.constraints import RANGE_KNOBS, Constraint, apply_constraints, check_constraints

if TYPE_CHECKING:  # pragma: no cover
    import optuna

#: PyTorch's DataLoader default batch size: the baseline every search measures.
DEFAULT_BATCH = 32

def probe_batch(max_batch: int, device: DeviceInfo) -> int:
    """The middle batch of the compute ceiling and the first guess: 64 on a CPU, 256 on a GPU."""
    return min(max_batch, 256 if device.type == "cuda" else 64)


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """Powers of two in ``[low, high]``."""
    if high < 1:
        return ()
    start = max(0, math.ceil(math.log2(max(1, low))))
    values = []
    k = start
    while 2**k <= high:
        values.append(2**k)
        k += 1
    return tuple(values)


@dataclass(frozen=True)
class Space:
    """Allowed values per knob. A knob with one value is fixed, not searched.

    Attributes:
        values: For each knob, its candidates in order. ``num_workers`` and
            ``prefetch_factor`` are searched as integer ranges over their
            min..max; the rest as categories.
        effective_batch: When set, ``batch_size x accumulation_steps`` equals
            it and accumulation follows from the batch.
        images: Samples in one epoch of the data; the loader's queue is
            kept within it (None: unknown, no cap).
    """

    values: dict[str, tuple[Any, ...]]
    effective_batch: int | None = None
    images: int | None = None

    def __post_init__(self) -> None:
        # A space built without the DDP knobs (a single process) keeps PyTorch's defaults for them.
        missing = {k: v for k, v in ddp_values(1).items() if k not in self.values}
        object.__setattr__(self, "values", {**self.values, **missing})
        for knob in KNOBS:
            if knob == "accumulation_steps" and self.effective_batch is not None:
                continue
            if not self.values.get(knob):
                raise UsageError(f"the search space leaves no value for {knob}; loosen --set")

    def searched(self) -> list[str]:
        """Knobs with more than one candidate."""
        return [k for k in KNOBS if len(self.values.get(k, ())) > 1]

    def is_range(self, knob: str) -> bool:
        """Whether ``knob`` is sampled as an integer range: a range knob whose
        values are every integer between their bounds. Choices the user gave
        (``--set num_workers=2,8``) stay choices."""
        values = tuple(self.values.get(knob, ()))
        return knob in RANGE_KNOBS and len(values) > 1 and values == tuple(range(min(values), max(values) + 1))

    def _pick(self, trial: optuna.Trial, knob: str, candidates: Sequence[Any] | None = None) -> Any:
        options = tuple(candidates if candidates is not None else self.values[knob])
        if len(options) == 1:
            return options[0]
        if self.is_range(knob):
            return trial.suggest_int(knob, min(options), max(options))
        return trial.suggest_categorical(knob, list(options))

    def suggest(self, trial: optuna.Trial) -> TrainSetup:
        """Sample one TrainSetup through an Optuna trial (define-by-run)."""
        workers = self._pick(trial, "num_workers")
        batch = self._pick(trial, "batch_size")
        prefetch = None
        persistent = False
        if workers > 0:
            prefetch = self._pick(trial, "prefetch_factor", self.prefetch_within_epoch(workers, batch))
            persistent = self._pick(trial, "persistent_workers")
        if self.effective_batch is not None:
            accumulation = self.effective_batch // batch
        else:
            accumulation = self._pick(trial, "accumulation_steps")
        return TrainSetup(
            num_workers=workers,
            prefetch_factor=prefetch,
            pin_memory=self._pick(trial, "pin_memory"),
            persistent_workers=persistent,
            batch_size=batch,
            accumulation_steps=accumulation,
            amp=self._pick(trial, "amp"),
            channels_last=self._pick(trial, "channels_last"),
            bucket_cap_mb=self._pick(trial, "bucket_cap_mb"),
            gradient_as_bucket_view=self._pick(trial, "gradient_as_bucket_view"),
            # DDP's static graph breaks under no_sync: only offered without accumulation.
            static_graph=self._pick(trial, "static_graph") if accumulation == 1 else False,
        )

    def prefetch_within_epoch(self, workers: int, batch: int) -> tuple[Any, ...]:
        """The prefetch depths whose loader queue (workers x prefetch x batch) fits in one epoch.

        A queue larger than the epoch prefetches batches the epoch does not
        hold. When even depth 1 does not fit, the smallest depth stays (the
        search then records the setup as infeasible without running it).
        """
        options = self.values["prefetch_factor"]
        if self.images is None:
            return options
        fitting = tuple(p for p in options if workers * p * batch <= self.images)
        return fitting or (min(options),)

    def describe(self) -> str:
        """One line: every knob's values (ranges as ``lo..hi``)."""
        parts = []
        for knob, values in self.values.items():
            if knob in DDP_KNOBS and len(values) == 1:  # a single process: DDP's knobs do not apply
                continue
            if knob == "accumulation_steps" and self.effective_batch is not None:
                parts.append(f"accumulation_steps=effective_batch/batch_size ({self.effective_batch})")
                continue
            if self.is_range(knob):
                parts.append(f"{knob}={min(values)}..{max(values)}")
            else:
                parts.append(f"{knob}={'|'.join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)}")
        return "space: " + ", ".join(parts)

    def params_for(self, setup: TrainSetup) -> dict[str, Any]:
        """The Optuna params that make :meth:`suggest` return ``setup``
        (for ``study.enqueue_trial``); knobs outside the space are clipped."""
        params: dict[str, Any] = {}
        for knob in self.searched():
            if knob in ("prefetch_factor", "persistent_workers") and setup.num_workers == 0:
                continue
            if knob == "accumulation_steps" and self.effective_batch is not None:
                continue
            value = getattr(setup, knob)
            options = self.values[knob]
            if self.is_range(knob):
                value = min(max(value if value is not None else 2, min(options)), max(options))
            elif value not in options:
                value = _nearest(value, options)
            params[knob] = value
        return params

    def contains(self, setup: TrainSetup) -> bool:
        """Whether ``setup`` lies inside the space."""
        for knob in KNOBS:
            if knob in ("prefetch_factor", "persistent_workers") and setup.num_workers == 0:
                continue
            if knob == "accumulation_steps" and self.effective_batch is not None:
                if setup.effective_batch() != self.effective_batch:
                    return False
                continue
            options = self.values[knob]
            value = getattr(setup, knob)
            if self.is_range(knob):
                if not (min(options) <= (value or 0) <= max(options)):
                    return False
            elif value not in options:
                return False
        return True


def _nearest(value: Any, options: Sequence[Any]) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
        isinstance(o, (int, float)) and not isinstance(o, bool) for o in options
    ):
        return min(options, key=lambda o: (abs(math.log2(max(o, 1)) - math.log2(max(value, 1))), o))
    return options[0]


def defaults_setup(effective_batch: int | None, batch: int | None = None) -> TrainSetup:
    """PyTorch's defaults: 0 workers, batch 32 (or a Task's recipe batch), fp32;
    the same math when the effective batch is pinned (accumulation makes up the difference)."""
    base = batch or DEFAULT_BATCH
    if effective_batch is None:
        return TrainSetup(batch_size=base)
    batch = max(d for d in range(1, min(base, effective_batch) + 1) if effective_batch % d == 0)
    return TrainSetup(batch_size=batch, accumulation_steps=effective_batch // batch)


def check_image_constraints(constraints: dict[str, Constraint], image_input: bool) -> None:
    """Refuse ``--set channels_last=true`` for a workload whose batches hold no 4-D floating tensor.

    Raises:
        UsageError: channels_last pinned on with nothing for it to act on.
    """
    pinned = constraints.get("channels_last")
    if not image_input and pinned is not None and pinned.allows(True) and not pinned.allows(False):
        raise UsageError("--set channels_last=true: this workload's batches hold no 4-D floating tensor for it to act on")


def ddp_values(world_size: int) -> dict[str, tuple[Any, ...]]:
    """The DDP knobs' candidates: searched with more than one rank, PyTorch's defaults otherwise."""
    if world_size > 1:
        return {"bucket_cap_mb": (10, 25, 50, 100), "gradient_as_bucket_view": (False, True), "static_graph": (False, True)}
    return {"bucket_cap_mb": (25,), "gradient_as_bucket_view": (False,), "static_graph": (False,)}


def build_space(
    *,
    device: DeviceInfo,
    calibration: Calibration,
    usable_cores: int,
    effective_batch: int | None,
    constraints: dict[str, Constraint],
    images: int | None = None,
    image_input: bool = True,
    world_size: int = 1,
) -> Space:
    """The space from the probe and the calibration, narrowed by ``--set``.

    Args:
        device: The resolved device.
        calibration: What the pre-pass measured (largest batch, workers).
        usable_cores: CPU cores this process may use.
        effective_batch: A pinned ``batch x accumulation``, or None.
        constraints: The user's ``--set`` constraints.
        images: Training images; an optimizer step (``batch x accumulation``)
            must fit in one epoch, so the batch and accumulation are capped.
        image_input: Whether batches hold a 4-D floating tensor; without one
            ``channels_last`` has nothing to act on and is not offered.
        world_size: Ranks per trial; the DDP knobs are searched only with more than one.

    Raises:
        UsageError: A constraint the device cannot run, one that leaves a
            knob without values, or an effective batch larger than the data.
    """
    cuda = device.type == "cuda"
    if images is not None and effective_batch is not None and effective_batch > images:
        raise UsageError(
            f"--effective-batch {effective_batch} is larger than the {images} training images: "
            "an epoch would hold no optimizer step"
        )
    amp: tuple[str, ...] = ("off",)
    if device.bf16:
        amp += ("bf16",)
    if cuda:
        amp += ("fp16",)
    # Batch 1 breaks BatchNorm in training mode; 8 is small enough everywhere.
    top = calibration.max_batch if images is None else max(1, min(calibration.max_batch, images))
    floor = 8 if top >= 8 else min(2, top)
    batches = powers_of_two(floor, top)
    if effective_batch is not None:
        batches = tuple(b for b in batches if effective_batch % b == 0) or (
            max(d for d in range(1, min(effective_batch, top) + 1) if effective_batch % d == 0),
        )
    accumulation: tuple[int, ...] = (1,)
    if effective_batch is None:
        accumulation = tuple(a for a in (1, 2, 4) if images is None or a * min(batches) <= images) or (1,)
    base: dict[str, tuple[Any, ...]] = {
        "num_workers": tuple(range(0, max(0, min(usable_cores, calibration.max_workers)) + 1)),
        "prefetch_factor": tuple(range(1, 9)),
        "pin_memory": (False, True) if cuda else (False,),
        # An endless sampler never ends an epoch inside a trial, so
        # persistent_workers cannot be measured there; it only saves the
        # worker restart at each epoch boundary, so it is on whenever workers are.
        "persistent_workers": (True,),
        "batch_size": batches,
        "accumulation_steps": accumulation,
        "amp": amp,
        "channels_last": (False, True) if image_input else (False,),
        **ddp_values(world_size),
    }
    check_constraints(constraints, device)
    check_image_constraints(constraints, image_input)
    values = apply_constraints(base, constraints)
    if effective_batch is not None:
        bad = [b for b in values["batch_size"] if effective_batch % b]
        if bad:
            raise UsageError(f"--effective-batch {effective_batch} is not a multiple of batch_size {bad[0]}")
    return Space(values=values, effective_batch=effective_batch, images=images)


#: Throughput gain from the small to the largest pre-pass batch that makes
#: the largest batch worth a first trial of its own.
BATCH_GAIN = 1.10


def guess_setups(space: Space, calibration: Calibration, device: DeviceInfo, usable_cores: int) -> list[TrainSetup]:
    """Probe-informed first trials, after the defaults (clipped into the space by the caller).

    The first guess takes workers from the loader ceiling, a middle batch
    (64 on a CPU, 256 on a GPU), and the precision and layout that computed
    fastest at that batch in the calibration (measured like for like). When the
    memory pre-pass measured throughput still rising with the batch (the
    largest batch at least 10 % faster than the smallest), a second guess
    is the first at the largest batch of the space.
    """
    first = guess_setup(space, calibration, device, usable_cores)
    guesses = [first]
    rates = sorted(
        (p.batch_size, p.samples_per_s) for p in calibration.memory_points if p.status == "ok" and p.samples_per_s
    )
    largest = max(space.values["batch_size"])
    if len(rates) >= 2 and rates[-1][1] >= BATCH_GAIN * rates[0][1] and largest > first.batch_size:
        guesses.append(first.replace(batch_size=largest))
    return [_queue_within_epoch(space, guess) for guess in guesses]


def _queue_within_epoch(space: Space, setup: TrainSetup) -> TrainSetup:
    """``setup`` with its prefetch depth lowered until the loader queue fits in one epoch."""
    if not setup.num_workers or setup.prefetch_factor is None:
        return setup
    fitting = [p for p in space.prefetch_within_epoch(setup.num_workers, setup.batch_size) if p <= setup.prefetch_factor]
    return setup.replace(prefetch_factor=max(fitting)) if fitting else setup


def guess_setup(space: Space, calibration: Calibration, device: DeviceInfo, usable_cores: int) -> TrainSetup:
    """A probe-informed first guess (clipped into the space by the caller)."""
    cuda = device.type == "cuda"
    workers = max(1, min(calibration.max_workers, usable_cores // 2 if not cuda else usable_cores))
    enough = calibration.workers_enough()
    if enough:
        workers = enough
    workers = min(workers, max(space.values["num_workers"]))
    batch = probe_batch(calibration.max_batch, device)
    amp, channels_last = ("bf16" if device.bf16 else ("fp16" if cuda else "off")), True
    fastest = calibration.fastest_precision()
    if fastest is not None:  # measured like for like at this batch: follow the numbers
        amp, channels_last = fastest.amp, fastest.channels_last
    return TrainSetup(
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        pin_memory=cuda,
        persistent_workers=workers > 0,
        batch_size=batch,
        amp=amp,  # type: ignore[arg-type]
        channels_last=channels_last,
    )
