"""The winner of a search and what limits it.

Turns the finished trials and the confirmation rounds into the ``best.json``
record (with the notes a user must read) and a one-line bottleneck verdict.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from autotune.devices import DeviceInfo
from autotune.output.best import Best
from autotune.records import Calibration, Confirmed, TrialRecord, Workload
from autotune.redact import hide_passwords
from autotune.train_setup import TrainSetup


def make_best(
    *,
    workload: Workload,
    hardware: Any,
    feasible: list[TrialRecord],
    confirmed: list[Confirmed],
    defaults: TrainSetup,
    effective_batch: int | None,
    command: str,
    interrupted: bool = False,
) -> Best:
    """The ``best.json`` record: the confirmed winner, its speedup and the notes.

    Args:
        workload: What was trained.
        hardware: The probe's ``Hardware`` (its summary is recorded).
        feasible: The trials that measured a throughput.
        confirmed: The confirmation rounds; empty when they did not run,
            and the fastest single trial is then the (unconfirmed) winner.
        defaults: The PyTorch-defaults setup of this search.
        effective_batch: The pinned ``--effective-batch``, or None.
        command: The command line, for the record.
        interrupted: The search was stopped (Ctrl-C, SIGTERM, SIGHUP).
    """
    default_key = defaults.to_json()
    notes: list[str] = []
    measured = [c for c in confirmed if c.median is not None]
    if measured:
        winner = max(measured, key=lambda c: c.median or 0.0)
        setup, rate, spread = winner.candidate.setup, winner.median or 0.0, winner.spread or 0.0
        base = next((c.median for c in measured if c.candidate.key == default_key), None)
    else:
        top = max(feasible, key=lambda r: r.result.samples_per_s or 0.0)
        setup, rate, spread = top.setup, top.result.samples_per_s or 0.0, top.result.samples_per_s_spread or 0.0
        base_records = [r for r in feasible if r.setup.to_json() == default_key]
        base = base_records[0].result.samples_per_s if base_records else None
        if interrupted:
            notes.append("not confirmed: the search was interrupted before the interleaved re-measurement")
        else:
            notes.append("not confirmed: every confirmation run failed; the fastest single trial is shown")
    peaks = [r.result.peak_memory_bytes for r in feasible if r.setup == setup and r.result.peak_memory_bytes]
    effective = setup.effective_batch()
    reference = effective_batch or defaults.effective_batch()
    lr = workload.lr * effective / reference
    if workload.data is None:
        notes.append("measured on synthetic JPEGs; re-run with --data DIR to tune on your own images")
    if setup.amp != "off":
        notes.append(f"amp={setup.amp} changes the numerics (autocast); check your accuracy once")
    if effective_batch is None and effective != reference:
        notes.append(
            f"effective batch {effective} differs from the reference {reference}: the learning rate is scaled "
            f"linearly by {effective / reference:g} to {lr:g}; pass --effective-batch {reference} to keep the math"
        )
    if base is None:
        notes.append("the PyTorch defaults could not be measured, so no speedup is given")
    hw = hardware.to_dict()
    return Best(
        setup=setup,
        workload=workload,
        samples_per_s=rate,
        samples_per_s_spread=spread,
        defaults_samples_per_s=base,
        speedup=(rate / base) if base else None,
        peak_memory_bytes=max(peaks) if peaks else None,
        effective_batch=effective,
        reference_batch=reference,
        lr=lr,
        hardware=hw,
        versions=dict(hw.get("software", {})),
        command=hide_passwords(command),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        notes=tuple(notes),
    )

def bottleneck_verdict(best: Best, calibration: Calibration, records: list[TrialRecord], device: DeviceInfo) -> str:
    """Which side limits training: the loader, the device, or both sharing CPUs."""
    winner = next((r for r in records if r.setup == best.setup and r.result.ok), None)
    wait = winner.result.data_wait_fraction if winner else None
    compute = calibration.compute_samples_per_s
    loader = max((p.samples_per_s or 0.0 for p in calibration.loader), default=0.0) or None
    parts = []
    if compute:
        parts.append(f"compute alone {compute:.0f} samples/s")
    if loader:
        parts.append(f"loader alone up to {loader:.0f} samples/s")
    parts.append(f"together {best.samples_per_s:.0f} samples/s")
    facts = "; ".join(parts)
    if wait is not None and wait > 0.2:
        return (
            f"input-bound: the winner waits on the DataLoader {wait:.0%} of the time ({facts}). "
            "Cheaper decoding (smaller stored images, fewer augmentations) or more CPU cores would help."
        )
    if device.type == "cpu" and compute and loader and best.samples_per_s < 0.8 * min(compute, loader):
        return (
            f"CPU-shared: decoding and training compete for the same cores ({facts}); "
            "each alone is faster than both together."
        )
    return f"compute-bound: the training step is the limit ({facts})."

