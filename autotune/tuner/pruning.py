"""Stop a trial early when it is clearly slower than the best so far."""

from __future__ import annotations

import statistics

import optuna
from optuna.trial import FrozenTrial, TrialState


class SlowerThanBestPruner(optuna.pruners.BasePruner):
    """Prune when the median of a trial's windows so far is below
    ``ratio`` x the best finished trial's throughput.

    Timings on a shared machine vary by 20-30 % from run to run, so the
    threshold is generous: only trials that are *clearly* slower stop early.

    Args:
        ratio: Fraction of the best value below which a trial is pruned.
        n_warmup_steps: Windows a trial always gets before it can be pruned.
    """

    def __init__(self, ratio: float = 0.6, n_warmup_steps: int = 2) -> None:
        if not 0 < ratio < 1:
            raise ValueError("ratio must be in (0, 1)")
        self.ratio = ratio
        self.n_warmup_steps = n_warmup_steps

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        """Optuna's pruning hook."""
        step = trial.last_step
        if step is None or step + 1 < self.n_warmup_steps:
            return False
        values = [v for v in trial.intermediate_values.values()]
        if not values:
            return False
        best = [
            t.value
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and t.value > 0
        ]
        if not best:
            return False
        return statistics.median(values) < self.ratio * max(best)
