"""The pruner: stop a trial only when it is clearly slower than the best finished one."""

from __future__ import annotations

import optuna
import pytest

from autotune.tuner.pruning import SlowerThanBestPruner


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=SlowerThanBestPruner(ratio=0.6, n_warmup_steps=2))
    study.tell(study.ask(), 100.0)
    return study


def test_clearly_slower_trials_are_pruned_after_the_warmup_windows() -> None:
    study = _study()
    trial = study.ask()
    trial.report(10.0, step=0)
    assert not trial.should_prune()  # one window is never enough
    trial.report(12.0, step=1)
    assert trial.should_prune()


def test_trials_within_the_noise_run_on() -> None:
    study = _study()
    trial = study.ask()
    for step, value in enumerate((70.0, 65.0, 50.0)):
        trial.report(value, step=step)
    assert not trial.should_prune()  # median 65 >= 0.6 x 100


def test_nothing_is_pruned_before_a_feasible_trial_finished() -> None:
    study = optuna.create_study(direction="maximize", pruner=SlowerThanBestPruner())
    study.tell(study.ask(), 0.0)  # an infeasible trial is worth 0
    trial = study.ask()
    trial.report(1.0, step=0)
    trial.report(1.0, step=1)
    assert not trial.should_prune()


@pytest.mark.parametrize("ratio", [0.0, 1.0, -1.0])
def test_bad_ratio_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError):
        SlowerThanBestPruner(ratio=ratio)
