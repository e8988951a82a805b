"""The screening pruner: one window stops what is far behind, two windows what cannot be a finalist."""

from __future__ import annotations

import optuna
import pytest

from autotune.tuner.pruning import CHECKPOINTS, ScreeningPruner


def _study(best: float = 100.0) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=ScreeningPruner({1: 0.6, 2: 0.8}))
    study.tell(study.ask(), best)
    return study


def _after(study: optuna.Study, values: list[float]) -> bool:
    trial = study.ask()
    for step, value in enumerate(values):
        trial.report(value, step=step)
    return trial.should_prune()


def test_far_behind_stops_after_one_window() -> None:
    assert _after(_study(), [50.0])
    assert not _after(_study(), [65.0])  # 0.65 x best: one window is not enough evidence


def test_not_a_finalist_stops_after_two_windows() -> None:
    assert _after(_study(), [65.0, 75.0])  # median 70 < 0.8 x 100
    assert not _after(_study(), [78.0, 86.0])  # median 82: within the noise of the leader


def test_after_the_checkpoints_a_trial_measures_every_window() -> None:
    assert not _after(_study(), [90.0, 90.0, 10.0])  # the third window is no checkpoint
    assert not _after(_study(), [90.0, 90.0, 10.0, 10.0, 10.0])


def test_the_defaults_checkpoints_tighten_with_evidence() -> None:
    ratios = [CHECKPOINTS[k] for k in sorted(CHECKPOINTS)]
    assert ratios == sorted(ratios) and all(0 < r < 1 for r in ratios)


def test_nothing_is_pruned_before_a_feasible_trial_finished() -> None:
    study = optuna.create_study(direction="maximize", pruner=ScreeningPruner())
    study.tell(study.ask(), 0.0)  # an infeasible trial is worth 0
    assert not _after(study, [1.0])
    assert not _after(study, [1.0, 1.0])


@pytest.mark.parametrize("checkpoints", [{}, {1: 0.0}, {1: 1.0}, {0: 0.5}, {2: -1.0}])
def test_bad_checkpoints_are_refused(checkpoints: dict[int, float]) -> None:
    with pytest.raises(ValueError):
        ScreeningPruner(checkpoints)


def test_defaults_the_set_excludes_are_no_bar_for_the_trials_within_it(tmp_path) -> None:
    """--set batch_size=16: the defaults (batch 32) are the baseline only, as in the progress line, not a bar to prune by."""
    from autotune.records import TrialResult
    from autotune.train_setup import TrainSetup
    from autotune.tuner.constraints import merge_constraints, parse_constraint
    from autotune.tuner.study import ROLE_DEFAULTS, ROLE_SEARCH, SearchStudy

    pins = merge_constraints([parse_constraint("batch_size=16")])
    study = SearchStudy.open(f"sqlite:///{tmp_path / 'study.db'}", "s", pins=pins)
    trial, _ = study.ask()
    result = TrialResult(status="ok", samples_per_s=100.0)
    study.record(trial, ROLE_DEFAULTS, TrainSetup(batch_size=32), result, None)
    study.tell(trial, result)
    within = TrainSetup(batch_size=16)
    trial, _ = study.ask()
    result = TrialResult(status="ok", samples_per_s=40.0)
    study.record(trial, ROLE_SEARCH, within, result, None)
    study.tell(trial, result)
    trial, _ = study.ask()
    for step, value in enumerate([70.0, 75.0]):  # faster than every setup within the --set, below 0.8 x the defaults
        trial.report(value, step=step)
    assert not trial.should_prune()
    result = TrialResult(status="ok", samples_per_s=70.0)
    study.record(trial, ROLE_SEARCH, within, result, None)
    study.tell(trial, result)
    trial, _ = study.ask()
    for step, value in enumerate([20.0, 20.0]):  # below 0.8 x the fastest within the --set still stops
        trial.report(value, step=step)
    assert trial.should_prune()
