"""What a trial repeats and how long it measures: its unit of work, how many windows, and when the measurement ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.records import TrialOptions


@dataclass(frozen=True)
class Work:
    """What a trial repeats, and how it warms up.

    Attributes:
        unit: One micro-batch in train and compute mode (the last of every ``per_step`` also takes
            the optimizer step), one batch in loader mode; windows close between units. Returns its samples.
        warmup_step: One warm-up step (a micro-batch and its own optimizer step in train and compute mode).
        warmup_steps: How many warm-up steps run before the windows.
        per_step: Units per optimizer step (the accumulation steps; 1 in loader mode). The measurement ends on a step boundary.
    """

    unit: Callable[[], int]
    warmup_step: Callable[[], int]
    warmup_steps: int
    per_step: int = 1


#: Windows measured even when fewer would fill the trial's seconds (slow steps).
MIN_WINDOWS = 3


def more_windows(measured: int, measured_s: float, options: TrialOptions) -> bool:
    """Whether a trial measures another window after ``measured`` windows and ``measured_s`` seconds.

    Every window of ``options.windows`` is measured, except that slow steps
    (each window one long micro-batch) stop after :data:`MIN_WINDOWS` once
    the trial's seconds are spent.
    """
    if measured >= options.windows:
        return False
    return measured < MIN_WINDOWS or measured_s < options.trial_seconds


def may_close(index: int, units: int, per_step: int, measured_s: float, options: TrialOptions) -> bool:
    """Whether window ``index``, its time up, may close after ``units`` micro-batches (windows then ``measured_s`` long).

    A window closes inside an optimizer step too, so a step of many
    micro-batches costs a trial no more than its own time; the last window
    waits for the step's end, so every measured step is whole, its optimizer
    step included.
    """
    return units % per_step == 0 or more_windows(index + 1, measured_s, options)
