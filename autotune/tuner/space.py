"""The search space: which values each knob may take, and how Optuna samples it.

The space comes from the probe and the calibration measurements, never from
rules of thumb: ``num_workers`` runs up to the cores this process may use
(past them where the calibration measured a loader that waits gain from more),
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
from autotune.epochs import queue_fits
from autotune.errors import UsageError
from autotune.records import Calibration, Workload
from autotune.train_setup import DDP_KNOBS, KNOBS, TrainSetup
from autotune.tuner.batch_sizes import batch_sizes, data_limit, divisor_space
from autotune.tuner.constraints import (
    RANGE_KNOBS,
    Constraint,
    apply_constraints,
    check_constraints,
    check_effective_batch,
    fit_steps_to_data,
    shown,
)
from autotune.tuner.offered import autocasts, check_workload_constraints, precision_note, torch_knob_values
from autotune.tuner.pins import check_pins_act, ddp_values

if TYPE_CHECKING:  # pragma: no cover
    import optuna

#: PyTorch's DataLoader default batch size: the baseline every search measures.
DEFAULT_BATCH = 32
#: Changes whenever a knob's sampled values or distribution change: a stored
#: study sampled another space, and Optuna refuses a parameter whose
#: distribution changed, so it is part of a study's signature. 2: torch's own
#: thread count joined ``num_threads`` (a choice, no longer an integer range).
#: 3 (only a study whose pinned effective batch is no power of two, see
#: :func:`space_version`): every divisor of it became a batch.
SPACE_VERSION = 2


def space_version(effective_batch: int | None) -> int:
    """The version of the space a search of ``effective_batch`` samples (:data:`SPACE_VERSION`; 3 where the batches
    became every divisor of the effective batch, the one space that rule changed)."""
    return 3 if divisor_space(effective_batch) else SPACE_VERSION


def probe_batch(max_batch: int, device: DeviceInfo) -> int:
    """The middle batch of the compute ceiling and the first guess: 64 on a CPU, 256 on a GPU."""
    return min(max_batch, 256 if device.type == "cuda" else 64)


#: The torch knobs at PyTorch's defaults (a space that does not search them).
TORCH_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "num_threads": (None,),
    "compile": ("off",),
    "cudnn_benchmark": (False,),
    "tf32": (False,),
    "optimizer_impl": (None,),
    "decode": ("cpu",),
}


@dataclass(frozen=True)
class Space:
    """Allowed values per knob. A knob with one value is fixed, not searched.

    Attributes:
        values: For each knob, its candidates in order. Range knobs (workers,
            prefetch, threads) are searched as integer ranges over their
            min..max unless given as a list (:meth:`is_range`).
        effective_batch: When set, ``batch_size x accumulation_steps`` equals
            it and accumulation follows from the batch.
        images: Samples in one epoch of the data; the loader's queue is
            kept within it (None: unknown, no cap).
        note: What the space leaves out and why, for its one-line description.
    """

    values: dict[str, tuple[Any, ...]]
    effective_batch: int | None = None
    images: int | None = None
    note: str = ""

    def __post_init__(self) -> None:
        # A space built by hand without the torch or DDP knobs keeps PyTorch's defaults for them.
        defaults = {**TORCH_DEFAULTS, **ddp_values(1)}
        missing = {knob: value for knob, value in defaults.items() if knob not in self.values}
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
        if knob not in RANGE_KNOBS or len(values) < 2 or not all(isinstance(v, int) for v in values):
            return False  # num_threads with torch's own choice (None) among the counts is a choice
        return values == tuple(range(min(values), max(values) + 1))

    def _pick(self, trial: optuna.trial.BaseTrial, knob: str, candidates: Sequence[Any] | None = None) -> Any:
        options = tuple(candidates if candidates is not None else self.values[knob])
        if len(options) == 1:
            return options[0]
        if self.is_range(knob):
            return trial.suggest_int(knob, min(options), max(options))
        try:
            return trial.suggest_categorical(knob, list(options))
        except ValueError as exc:  # Optuna's words name no knob: the user must know which one changed
            from optuna.distributions import CategoricalDistribution

            study = getattr(trial, "study", None)
            trials = study.get_trials(deepcopy=False) if study is not None and "dynamic value space" in str(exc) else []
            earlier = next((t.distributions[knob] for t in trials if knob in t.distributions), None)
            if not isinstance(earlier, CategoricalDistribution):
                raise
            raise ValueError(f"dynamic value space: {knob}={'|'.join(map(shown, earlier.choices))} in the study's trials, "
                             f"{knob}={'|'.join(map(shown, options))} in this search") from None

    def suggest(self, trial: optuna.trial.BaseTrial) -> TrainSetup:
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
            num_threads=self._pick(trial, "num_threads"),
            compile=self.sampled_compile(trial),
            cudnn_benchmark=self._pick(trial, "cudnn_benchmark"),
            tf32=self._pick(trial, "tf32"),
            optimizer_impl=self._pick(trial, "optimizer_impl"),
            decode=self._pick(trial, "decode"),
            bucket_cap_mb=self._pick(trial, "bucket_cap_mb"),
            gradient_as_bucket_view=self._pick(trial, "gradient_as_bucket_view"),
            # DDP's static graph breaks under no_sync: only offered without accumulation.
            static_graph=self._pick(trial, "static_graph") if accumulation == 1 else False,
        )

    def sampled_compile(self, trial: optuna.trial.BaseTrial) -> Any:
        """``off`` whenever eager is allowed: compiled modes are tried on the leading setup instead
        (:mod:`autotune.tuner.refine`); the user's choice when ``--set`` leaves no eager mode."""
        if "off" in self.values["compile"]:
            return "off"
        return self._pick(trial, "compile")

    def compile_modes(self) -> tuple[str, ...]:
        """The compiled modes a refinement tries on the leading setup (none when compile is pinned)."""
        modes = self.values["compile"]
        return tuple(m for m in modes if m != "off") if "off" in modes else ()

    def prefetch_within_epoch(self, workers: int, batch: int) -> tuple[Any, ...]:
        """The prefetch depths whose loader queue (workers x prefetch x batch) fits in one epoch.

        A queue larger than the epoch prefetches batches the epoch does not
        hold. When even depth 1 does not fit, the smallest depth stays (the
        search then records the setup as infeasible without running it).
        """
        options = self.values["prefetch_factor"]
        fitting = tuple(p for p in options if self.queue_fits(workers, p, batch))
        return fitting or (min(options),)

    def queue_fits(self, workers: int, prefetch: int, batch: int) -> bool:
        """Whether a loader queue of ``workers x prefetch x batch`` samples fits in one epoch (always, epoch unknown)."""
        return queue_fits(workers, prefetch, batch, self.images)

    def describe(self) -> str:
        """One line: every knob's values (ranges as ``lo..hi``)."""
        parts = []
        for knob, values in self.values.items():
            if knob in DDP_KNOBS and len(values) == 1:  # a single process: DDP's knobs do not apply
                continue
            if knob in ("prefetch_factor", "persistent_workers") and self.values["num_workers"] == (0,):  # no worker to apply to
                continue
            if knob == "accumulation_steps" and self.effective_batch is not None:
                parts.append(f"accumulation_steps=effective_batch/batch_size ({self.effective_batch})")
                continue
            if self.is_range(knob):
                parts.append(f"{knob}={min(values)}..{max(values)}")
            else:
                parts.append(f"{knob}={'|'.join(shown(v) for v in values)}")
        return "space: " + ", ".join(parts) + (f"; {self.note}" if self.note else "")

    def params_for(self, setup: TrainSetup) -> dict[str, Any]:
        """The Optuna params that make :meth:`suggest` return ``setup``
        (for ``study.enqueue_trial``); knobs outside the space are clipped."""
        params: dict[str, Any] = {}
        for knob in self.searched():
            if knob in ("prefetch_factor", "persistent_workers") and setup.num_workers == 0:
                continue
            if knob == "accumulation_steps" and self.effective_batch is not None:
                continue
            if knob == "compile" and "off" in self.values[knob]:
                continue  # not an Optuna parameter (see sampled_compile)
            value = getattr(setup, knob)
            options = self.values[knob]
            if value is None and knob in _TORCH_PICKS and None not in options:  # torch's own choice: its usual equivalent
                value = max(options) if knob == "num_threads" else options[0]
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
            if value is None and knob in _TORCH_PICKS:
                continue  # torch's own choice is always available
            if self.is_range(knob):
                if not (min(options) <= (value or 0) <= max(options)):
                    return False
            elif value not in options:
                return False
        return True


#: Knobs whose ``None`` means "what torch picks by itself".
_TORCH_PICKS = ("num_threads", "optimizer_impl")


def _nearest(value: Any, options: Sequence[Any]) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
        isinstance(o, (int, float)) and not isinstance(o, bool) for o in options
    ):
        return min(options, key=lambda o: (abs(math.log2(max(o, 1)) - math.log2(max(value, 1))), o))
    return options[0]


def defaults_setup(effective_batch: int | None, batch: int | None = None, images: int | None = None) -> TrainSetup:
    """PyTorch's defaults: 0 workers, batch 32 (or a Task's recipe batch), fp32;
    the same math when the effective batch is pinned (accumulation makes up the difference).

    Data of fewer ``images`` than that batch is one batch of all of them, as a
    DataLoader of it yields (a trial keeps whole batches only, so batch 32 could not run);
    for a stream too short for it, ``images`` is the largest batch the stream fills.
    """
    base = batch or DEFAULT_BATCH
    if images is not None:
        base = max(1, min(base, images))
    if effective_batch is None:
        return TrainSetup(batch_size=base)
    batch = max(d for d in range(1, min(base, effective_batch) + 1) if effective_batch % d == 0)
    return TrainSetup(batch_size=batch, accumulation_steps=effective_batch // batch)


def failed_precisions(calibration: Calibration) -> dict[str, str]:
    """The reduced precisions in which every compute-only run of the calibration failed (not for memory), with the status;
    none where every float32 run failed too (a loss that turns NaN after some steps: not the precision's fault)."""
    statuses = {amp: {p.status for p in calibration.precisions if p.amp == amp} for amp in {p.amp for p in calibration.precisions}}
    if statuses.get("off", {"ok"}) <= {"error", "diverged"}:
        return {}
    return {amp: "/".join(sorted(seen)) for amp, seen in statuses.items() if amp != "off" and seen <= {"error", "diverged"}}


def failed_layout(calibration: Calibration) -> str | None:
    """The status of the channels_last layout where every compute-only run of the calibration in it failed (not for
    memory: a model that flattens with ``view``, one with 5-D weights) while the contiguous run of each of those precisions
    ran (like for like: the layout's fault, not the model's or the precision's); else None."""
    runs = {(p.amp, p.channels_last): p.status for p in calibration.precisions}
    layout = {amp: status for (amp, last), status in runs.items() if last}
    if not layout or not all(status in ("error", "diverged") and runs.get((amp, False)) == "ok" for amp, status in layout.items()):
        return None
    return "/".join(sorted(set(layout.values())))


def build_space(
    *,
    device: DeviceInfo,
    calibration: Calibration,
    usable_cores: int,
    effective_batch: int | None,
    constraints: dict[str, Constraint],
    images: int | None = None,
    image_input: bool = True,
    workload: Workload | None = None,
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
        workload: What is trained; it decides where cuDNN autotuning, GPU
            decoding and optimizer kernels are offered (:mod:`autotune.tuner.offered`).
        world_size: Ranks per trial; the DDP knobs are searched only with more than one.

    Raises:
        UsageError: A constraint the device cannot run, one that leaves a
            knob without values, or an effective batch larger than the data.
    """
    cuda = device.type == "cuda"
    check_effective_batch(effective_batch, images)
    amp: tuple[str, ...] = ("off",)
    if device.bf16:
        amp += ("bf16",)
    if cuda:
        amp += ("fp16",)
    # Batch 1 breaks BatchNorm in training mode; 8 is small enough everywhere.
    top = calibration.max_batch if images is None else max(1, min(calibration.max_batch, images))
    floor = 8 if top >= 8 else min(2, top)
    batches = batch_sizes(floor, top, effective_batch)
    accumulation = (1,) if effective_batch is not None else (1, 2, 4)  # the data's bound comes with the --set ones (fit_steps_to_data)
    base: dict[str, tuple[Any, ...]] = {
        # Up to the cores, or past them where the calibration measured a loader that waits gain from more (loader_ceiling).
        "num_workers": tuple(range(0, max(0, calibration.max_workers) + 1)),
        "prefetch_factor": tuple(range(1, 9)),
        "pin_memory": (False, True) if cuda else (False,),
        # Not measurable with an endless sampler (no epoch ends in a trial); it only saves each epoch's worker restart.
        "persistent_workers": (True,),
        "batch_size": batches,
        "accumulation_steps": accumulation,
        "amp": amp,
        "channels_last": (False, True) if image_input else (False,),
        **torch_knob_values(device, workload, usable_cores),
        **ddp_values(world_size),
    }
    check_constraints(constraints, device)
    check_pins_act(constraints, image_input, world_size)
    check_workload_constraints(constraints, workload, device)
    data_bound = images is not None and (top < calibration.max_batch or calibration.batch_bound == "data")  # a range may reach it
    limit = data_limit(images) if data_bound and images is not None else calibration.batch_limit
    most = images if data_bound and images is not None else top
    values = apply_constraints(base, constraints, {"batch_size": f"no batch above {most}: {limit}" if limit else ""}, {"batch_size": most})
    values["amp"] = autocasts(values["amp"], workload)  # a Task's model in float64, say: none would change what it computes
    failed = failed_precisions(calibration)
    if failed:  # a precision whose compute-only runs all failed fails in every trial too
        values["amp"] = tuple(a for a in values["amp"] if a not in failed)
        if not values["amp"]:
            raise UsageError(f"--set amp: the model failed in {' and '.join(f'{a} ({why})' for a, why in failed.items())} in every "
                             "compute-only run of the calibration (its lines above say why); allow amp=off")
    layout = failed_layout(calibration)
    if layout:  # as a precision: channels_last fails in every trial too
        values["channels_last"] = tuple(c for c in values["channels_last"] if not c)
        if not values["channels_last"]:
            raise UsageError(f"--set channels_last=true: the model failed in channels_last ({layout}) in every compute-only run of the "
                             "calibration (its lines above say why); allow channels_last=false")
    if images is not None:  # a step must fit in an epoch: a pinned accumulation bounds the batch, a pinned batch the steps
        fit_steps_to_data(values, constraints, images)
    if workload is not None and workload.unsharded:  # a range of workers (0..4) keeps its part that adds no copies
        values["num_workers"] = tuple(n for n in values["num_workers"] if n <= 1) or (0,)
    if effective_batch is not None:
        bad = [b for b in values["batch_size"] if effective_batch % b]
        if bad:
            raise UsageError(f"--effective-batch {effective_batch} is not a multiple of batch_size {bad[0]}")
    if values["static_graph"] == (True,) and effective_batch is not None and all(b < effective_batch for b in values["batch_size"]):
        raise UsageError(f"--set static_graph=true does not work with accumulation_steps > 1 (DDP's no_sync breaks its reducer), "
                         f"and --effective-batch {effective_batch} with the batches the --set pins allow leaves no step of one "
                         "micro-batch")  # the pins alone: check_pins_act, before the calibration
    left = {f"amp={a}": why for a, why in failed.items()} | ({"channels_last=true": layout} if layout else {})
    note = "; ".join([*(f"{knob} left out: every compute-only run in it ended {why} in the calibration" for knob, why in left.items()),
                      *filter(None, [precision_note(workload)])])
    return Space(values=values, effective_batch=effective_batch, images=images, note=note)
