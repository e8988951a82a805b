"""How long a trial measures: its windows, and when an epoch is short enough to measure with its boundaries."""

from __future__ import annotations

from autotune.records import TrialOptions
from autotune.train_setup import TrainSetup

#: Windows measured even when fewer would fill the trial's seconds (slow steps).
MIN_WINDOWS = 3


#: An epoch of fewer micro-batches than this is measured with its real epoch boundaries.
SHORT_EPOCH_BATCHES = 64


def short_epoch(samples: int, setup: TrainSetup) -> bool:
    """Whether an epoch of ``samples`` holds so few micro-batches that its boundaries cost measurable time."""
    return samples // setup.batch_size < SHORT_EPOCH_BATCHES


#: A short epoch is measured whole, for at most this many times the trial's seconds.
EPOCH_CAP = 3.0


def more_windows(
    measured: int, measured_s: float, options: TrialOptions, *, samples: int = 0, epoch_samples: int = 0
) -> bool:
    """Whether a trial measures another window after ``measured`` windows, ``measured_s`` seconds and ``samples`` samples.

    Every window of ``options.windows`` is measured, except that slow steps
    (each window one long step) stop after :data:`MIN_WINDOWS` once the
    trial's seconds are spent. With ``epoch_samples`` (a short epoch of known
    length, looped as the script loops it) the windows go on until a whole
    epoch was measured, so its boundary (the loader's pipeline restarting)
    is in the figure, for at most :data:`EPOCH_CAP` times the trial's seconds.
    """
    if epoch_samples and samples < epoch_samples and measured_s < EPOCH_CAP * options.trial_seconds:
        return True
    if measured >= options.windows:
        return False
    return measured < MIN_WINDOWS or measured_s < options.trial_seconds
