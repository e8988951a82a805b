"""The methods the benchmark compares, and the interleaved final round.

Every method ends in one :class:`~autotune.train_setup.TrainSetup` (its pick).
Fixed methods (``defaults``, ``recipe``) cost nothing to choose; ``max_batch``
doubles the batch in short compute-only trials; ``grid`` measures every point
of a discretized space once; ``random`` and ``autotune`` are full
:func:`~autotune.tuner.run_search` runs. All picks are then re-measured by
the same trial runner in interleaved rounds (:func:`measure_interleaved`).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.devices import DeviceInfo
from autotune.records import TrialOptions, TrialRecord, TrialResult, Workload
from autotune.runner import TrialRunner, run_trial
from autotune.train_setup import TrainSetup
from autotune.tuner.calibrate import BATCH_CAP, calibration_seconds, memory_budget
from autotune.tuner.space import Space

Log = Callable[[str], None]


@dataclass
class MethodResult:
    """One method's pick and what it cost to find it.

    Attributes:
        name: Method name (``defaults``, ``recipe``, ...).
        setup: The pick.
        trials: Trial runs the method spent choosing (0 for fixed setups).
        wall_s: Wall time spent choosing.
        selection_samples_per_s: What the method itself measured for its pick
            (None for fixed setups).
        samples_per_s: Median of the final interleaved rounds (filled later).
        measurements: The final rounds' values, in round order.
        failures: Final-round measurements that failed.
        ratio_to_grid: ``samples_per_s`` / the grid pick's ``samples_per_s``.
        extra: Method-specific details (search timing, per-trial values, ...).
    """

    name: str
    setup: TrainSetup
    trials: int = 0
    wall_s: float = 0.0
    selection_samples_per_s: float | None = None
    samples_per_s: float | None = None
    measurements: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    ratio_to_grid: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the shape ``benchmarks/results/*.json`` uses)."""
        return {
            "setup": self.setup.to_dict(),
            "describe": self.setup.describe(),
            "samples_per_s": self.samples_per_s,
            "measurements": list(self.measurements),
            "failures": list(self.failures),
            "ratio_to_grid": self.ratio_to_grid,
            "trials": self.trials,
            "wall_s": round(self.wall_s, 2),
            "selection_samples_per_s": self.selection_samples_per_s,
            **self.extra,
        }


def defaults_method() -> MethodResult:
    """PyTorch defaults: no workers, batch 32, fp32, no accumulation."""
    return MethodResult("defaults", TrainSetup(batch_size=32))


def recipe_method(device: DeviceInfo, usable_cores: int) -> MethodResult:
    """The tutorial recipe: 8 workers, prefetch 2, batch 64, AMP on.

    bf16 on a CPU (fp32 when the CPU lacks native bf16), fp16 on CUDA,
    pinned memory on CUDA. 8 workers regardless of the cores is the point:
    it is the rule of thumb being tested. (AdamW is what every trial trains
    with already.)
    """
    cuda = device.type == "cuda"
    amp = "fp16" if cuda else ("bf16" if device.bf16 else "off")
    setup = TrainSetup(
        num_workers=8,
        prefetch_factor=2,
        pin_memory=cuda,
        persistent_workers=True,
        batch_size=64,
        amp=amp,  # type: ignore[arg-type]
    )
    notes = [] if amp != "off" else ["this CPU has no native bf16: the recipe runs fp32"]
    return MethodResult("recipe", setup, extra={"notes": notes, "usable_cores": usable_cores})


def max_batch_method(
    workload: Workload,
    device: DeviceInfo,
    *,
    available_bytes: int,
    trial_seconds: float,
    start: int = 32,
    cap: int | None = None,
    runner: TrialRunner = run_trial,
    log: Log = lambda _m: None,
) -> MethodResult:
    """Lightning-style ``scale_batch_size(mode="power")``: double until it fails.

    Each step is a short compute-only trial (the model on one batch already on
    the device), as in autotune's memory pre-pass. It stops at the first
    failure (out of memory or over the same memory budget the search uses), or
    when the next batch would exceed the search's caps: ``BATCH_CAP``, and a
    step that takes more than half a trial (so it can still be measured).
    Everything else stays at the PyTorch defaults. ``cap`` lowers the
    largest batch tried (the quick smoke run uses it).
    """
    began = time.monotonic()
    budget = memory_budget(device, None, available_bytes)
    short = TrialOptions(trial_seconds=calibration_seconds(trial_seconds), windows=2, mode="compute", max_memory_bytes=budget)
    batch, best, runs, steps = start, None, 0, []
    limit = min(BATCH_CAP, cap) if cap else BATCH_CAP
    while batch <= limit:
        result = runner(TrainSetup(batch_size=batch), workload, short)
        runs += 1
        steps.append({"batch_size": batch, "status": result.status, "samples_per_s": result.samples_per_s})
        log(f"  max_batch: batch {batch}: {result.status} {_rate(result)}")
        if not result.ok or not result.samples_per_s:
            break
        best = batch
        if 2 * batch > result.samples_per_s * trial_seconds / 2:
            break  # the next step would take more than half a trial
        batch *= 2
    chosen = best or start
    return MethodResult(
        "max_batch",
        TrainSetup(batch_size=chosen),
        trials=runs,
        wall_s=time.monotonic() - began,
        extra={"doubling": steps},
    )


def _spread(values: Sequence[int], count: int) -> tuple[int, ...]:
    """Up to ``count`` values from a sorted sequence: both ends and evenly between."""
    values = sorted(set(values))
    if len(values) <= count:
        return tuple(values)
    if count == 1:
        return (values[-1],)
    picks = {values[round(i * (len(values) - 1) / (count - 1))] for i in range(count)}
    return tuple(sorted(picks))


@dataclass(frozen=True)
class GridSpec:
    """How finely the search space is discretized for the grid.

    Attributes:
        workers: Worker counts kept (both ends of the space's range and
            evenly between).
        batches: Batch sizes kept (the largest ones of the space).
        prefetch: The prefetch factor used whenever workers > 0.
        accumulation: Accumulation steps kept.
        channels_last: channels_last values kept (None: all the space offers).
    """

    workers: int = 3
    batches: int = 3
    prefetch: int = 2
    accumulation: tuple[int, ...] = (1,)
    channels_last: tuple[bool, ...] | None = None


def grid_points(space: Space, spec: GridSpec) -> list[TrainSetup]:
    """Every combination of the discretized space.

    Workers: ``spec.workers`` values spread over the space's range. Batches:
    the ``spec.batches`` largest of the space. AMP, channels_last and
    pin_memory: every value the space offers. Prefetch is fixed at
    ``spec.prefetch`` (clipped into the space), persistent_workers follows
    the space.
    """
    workers = _spread(space.values["num_workers"], spec.workers)
    batches = tuple(sorted(space.values["batch_size"])[-spec.batches :])
    prefetch_values = space.values["prefetch_factor"]
    prefetch = min(max(spec.prefetch, min(prefetch_values)), max(prefetch_values))
    accumulation = tuple(a for a in spec.accumulation if a in space.values["accumulation_steps"]) or (1,)
    persistent = space.values["persistent_workers"][0]
    layouts = tuple(c for c in space.values["channels_last"] if spec.channels_last is None or c in spec.channels_last)
    points = []
    for w, b, acc, amp, cl, pin in itertools.product(
        workers, batches, accumulation, space.values["amp"], layouts or (False,), space.values["pin_memory"]
    ):
        points.append(
            TrainSetup(
                num_workers=w,
                prefetch_factor=prefetch if w else None,
                persistent_workers=bool(persistent and w),
                pin_memory=pin,
                batch_size=b,
                accumulation_steps=acc,
                amp=amp,
                channels_last=cl,
            )
        )
    return points


def grid_method(
    points: Sequence[TrainSetup],
    workload: Workload,
    options: TrialOptions,
    *,
    runner: TrialRunner = run_trial,
    log: Log = lambda _m: None,
) -> MethodResult:
    """Measure every grid point once; the pick is the fastest.

    ``extra["top"]`` holds the three fastest points in order, so the final
    rounds can re-measure them and the reference is not the winner's curse
    of one lucky measurement.
    """
    began = time.monotonic()
    rows = []
    best: tuple[float, TrainSetup] | None = None
    for i, setup in enumerate(points, 1):
        result = runner(setup, workload, options)
        rate = result.samples_per_s if result.ok else None
        rows.append({"setup": setup.to_dict(), "status": result.status, "samples_per_s": rate})
        log(f"  grid {i}/{len(points)} {setup.describe()}: {result.status} {_rate(result)}")
        if rate and (best is None or rate > best[0]):
            best = (rate, setup)
    if best is None:
        raise RuntimeError("every grid point failed")
    ranked = sorted((r for r in rows if r["samples_per_s"]), key=lambda r: r["samples_per_s"], reverse=True)
    return MethodResult(
        "grid",
        best[1],
        trials=len(points),
        wall_s=time.monotonic() - began,
        selection_samples_per_s=best[0],
        extra={"points": rows, "top": [r["setup"] for r in ranked[:3]]},
    )


def confirm_grid(grid: MethodResult, contenders: Sequence[MethodResult]) -> MethodResult:
    """The grid's confirmed pick: of its top points re-measured in the final rounds, the best median.

    ``contenders`` are ``grid`` itself and its runners-up, after
    :func:`measure_interleaved`; the result keeps the grid's cost and notes
    which single-measurement rank won.
    """
    measured = [c for c in contenders if c.samples_per_s]
    if not measured:
        return grid
    best = max(measured, key=lambda c: c.samples_per_s or 0.0)
    rank = [c.name for c in contenders].index(best.name) + 1
    extra = {**grid.extra, "confirmed_rank": rank, "top_medians": [c.samples_per_s for c in contenders]}
    return MethodResult(
        "grid", best.setup, trials=grid.trials, wall_s=grid.wall_s, selection_samples_per_s=grid.selection_samples_per_s,
        samples_per_s=best.samples_per_s, measurements=list(best.measurements), failures=list(best.failures), extra=extra,
    )


def per_trial_values(records: Sequence[TrialRecord]) -> list[float | None]:
    """Each measured search trial's samples/s in trial order (None: failed or pruned).

    Free trials (nothing ran: a repeat or a setup the data cannot feed) are left out: they cost no measurement.
    """
    ordered = sorted((r for r in records if not r.free), key=lambda r: r.number)
    return [r.result.samples_per_s if r.result.ok else None for r in ordered]


def trials_to_reach(values: Sequence[float | None], target: float) -> int | None:
    """1-based count of trials until one measured at least ``target`` (None: never)."""
    for i, value in enumerate(values, 1):
        if value is not None and value >= target:
            return i
    return None


#: An extra contestant of the final rounds that is not a trial: it measures itself once per round.
Measurement = Callable[[], tuple[float | None, str | None]]


def measure_interleaved(
    methods: Sequence[MethodResult],
    workload: Workload,
    options: TrialOptions,
    rounds: int,
    *,
    runner: TrialRunner = run_trial,
    log: Log = lambda _m: None,
    extras: dict[str, tuple[MethodResult, Measurement]] | None = None,
) -> None:
    """Re-measure every pick in interleaved rounds (A B C ... A B C ...).

    Methods that picked the same setup share its measurements (each unique
    setup runs once per round). ``extras`` (the emitted train.py, say) each
    measure themselves once per round, after the trials of that round, into
    their own MethodResult. Fills ``samples_per_s`` (median),
    ``measurements`` and ``failures`` in place.
    """
    unique: dict[str, TrainSetup] = {}
    for method in methods:
        unique.setdefault(method.setup.to_json(), method.setup)
    values: dict[str, list[float]] = {k: [] for k in unique}
    failures: dict[str, list[str]] = {k: [] for k in unique}
    extras = extras or {}
    for r in range(rounds):
        for key, setup in unique.items():
            result = runner(setup, workload, options)
            if result.ok and result.samples_per_s:
                values[key].append(result.samples_per_s)
            else:
                failures[key].append(f"{result.status}: {result.error}")
            names = ",".join(m.name for m in methods if m.setup.to_json() == key)
            log(f"  round {r + 1}/{rounds} {names}: {_rate(result)}")
        for name, (method, measure) in extras.items():
            value, error = measure()
            if value is not None:
                method.measurements.append(value)
            else:
                method.failures.append(error or "no measurement")
            log(f"  round {r + 1}/{rounds} {name}: {f'{value:.1f} samples/s' if value is not None else error}")
    for method in methods:
        key = method.setup.to_json()
        method.measurements = list(values[key])
        method.failures = list(failures[key])
        method.samples_per_s = float(statistics.median(values[key])) if values[key] else None
    for method, _ in extras.values():
        method.samples_per_s = float(statistics.median(method.measurements)) if method.measurements else None


def _rate(result: TrialResult) -> str:
    if result.ok and result.samples_per_s is not None:
        return f"{result.samples_per_s:.1f} samples/s"
    return f"({result.error or result.status})"
