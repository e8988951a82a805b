"""How long a trial measures: how many windows, and when the measurement ends."""

from __future__ import annotations

from autotune.records import TrialOptions

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
