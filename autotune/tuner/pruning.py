"""Screen every new setup with a short measurement; measure in full only the contenders.

A search trial reports each measured window's samples/s to Optuna. At a few
checkpoints (after the first window, after the second) the trial's median so
far is compared with the best finished trial: below the checkpoint's ratio it
stops as ``pruned``. The ratio rises with the evidence: one window only stops
what is far behind, two windows stop what is unlikely to be a finalist. What
survives the checkpoints measures every window, so the finalists the
confirmation re-measures all have full measurements.

The ratios sit below 1 by more than the run-to-run noise of a shared machine
(the same setup re-run in a fresh process varies by 20-30 %), so a setup as
fast as the leader is rarely stopped by an unlucky start; they were chosen
by replaying measured traces (``python -m benchmarks.fidelity``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

#: Windows measured -> the fraction of the best finished value the median so far must reach.
CHECKPOINTS: Mapping[int, float] = {1: 0.6, 2: 0.8}


class ScreeningPruner(optuna.pruners.BasePruner):
    """Stop a trial at a checkpoint when its median so far is below ``ratio`` x the best finished value.

    Args:
        checkpoints: Windows measured -> ratio in (0, 1). Between and after
            the checkpoints nothing is stopped.
        counts: Which finished trials set the bar (None: all). The search leaves out the
            PyTorch defaults its ``--set`` excludes: they are the baseline only.
    """

    def __init__(self, checkpoints: Mapping[int, float] = CHECKPOINTS, counts: Callable[[FrozenTrial], bool] | None = None) -> None:
        if not checkpoints:
            raise ValueError("at least one checkpoint is needed")
        for windows, ratio in checkpoints.items():
            if windows < 1:
                raise ValueError(f"a checkpoint needs at least one window, got {windows}")
            if not 0 < ratio < 1:
                raise ValueError(f"ratio must be in (0, 1), got {ratio}")
        self.checkpoints = dict(checkpoints)
        self.counts = counts

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        """Optuna's pruning hook: called after each reported window."""
        values = list(trial.intermediate_values.values())
        ratio = self.checkpoints.get(len(values))
        if ratio is None:
            return False
        best = [
            t.value
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and t.value > 0 and (self.counts is None or self.counts(t))
        ]
        if not best:
            return False
        return statistics.median(values) < ratio * max(best)
