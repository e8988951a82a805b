"""Knob importance from the trial records, with Optuna's importance evaluators.

The records are copied into an in-memory Optuna study (one complete trial per
trial that measured a throughput, its knobs as parameters, samples/s as
value; a pruned trial counts with the median of the windows it measured,
the figure the screening judged), so the report needs no access to the study's storage. Optuna's fANOVA and mean-decrease-
impurity evaluators need scikit-learn; without it Optuna's PED-ANOVA
evaluator (numpy and scipy only, Optuna's default from version 5) is used.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from autotune.records import TrialRecord
from autotune.train_setup import KNOBS

#: Fewer measured trials than this and no importance is computed: PED-ANOVA's top group would hold one or two trials,
#: and its bars followed the fastest trial's knobs whatever the others measured (equal rates or 15x apart alike).
FEW_TRIALS = 10
#: The fewest trials in PED-ANOVA's top group (Optuna advises at least 5 for a stable figure).
TOP_TRIALS = 5


@dataclass(frozen=True)
class Importance:
    """Knob importances (summing to 1) and how they were computed.

    Attributes:
        values: Importance per knob that varied, largest first.
        evaluator: The Optuna evaluator's name.
        trials: Trials they rest on (feasible and pruned).
        top: PED-ANOVA's top group: the fastest trials whose knobs it compares with all of them (None: fANOVA).
    """

    values: dict[str, float]
    evaluator: str
    trials: int
    top: int | None


def _evaluator(trials: int) -> optuna.importance.BaseImportanceEvaluator:
    if importlib.util.find_spec("sklearn") is not None:
        return optuna.importance.FanovaImportanceEvaluator(seed=0)
    return optuna.importance.PedAnovaImportanceEvaluator(target_quantile=_quantile(trials))


def _quantile(trials: int) -> float:
    """PED-ANOVA's target quantile: its 10 %, or more where that holds fewer than :data:`TOP_TRIALS` trials."""
    return min(0.5, max(0.1, TOP_TRIALS / trials))


def _value(record: TrialRecord, knob: str) -> object:
    value = getattr(record.setup, knob)
    return 0 if value is None else value  # prefetch_factor without workers


def measured_trials(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The trials the importances rest on: those that measured a throughput (a pruned one with the median of its
    windows), but the PyTorch defaults' (the baseline, not a point of the searched space: with it, a knob the user's
    ``--set`` pinned would be credited with the pin's effect) and those reused from another study."""
    return [r for r in records if r.result.status in ("ok", "pruned") and r.result.samples_per_s and r.reused_from is None
            and r.role != "defaults"]


def knob_importance(records: Sequence[TrialRecord]) -> Importance | None:
    """The importance of each knob that varied among :func:`measured_trials`; None with fewer than
    :data:`FEW_TRIALS` of them or no knob that varied."""
    feasible = measured_trials(records)
    varied = [k for k in KNOBS if len({_value(r, k) for r in feasible}) > 1]
    if len(feasible) < FEW_TRIALS or not varied:
        return None
    distributions: dict[str, BaseDistribution] = {}
    for knob in varied:
        seen = sorted({_value(r, knob) for r in feasible}, key=repr)
        numbers = [v for v in seen if isinstance(v, int) and not isinstance(v, bool)]
        if len(numbers) == len(seen):
            distributions[knob] = IntDistribution(min(numbers), max(numbers))
        else:
            distributions[knob] = CategoricalDistribution(seen)  # type: ignore[arg-type]
    study = optuna.create_study(direction="maximize", storage=optuna.storages.InMemoryStorage())
    for r in feasible:
        params = {k: _value(r, k) for k in varied}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=r.result.samples_per_s))
    evaluator = _evaluator(len(feasible))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = optuna.importance.get_param_importances(study, evaluator=evaluator, normalize=True)
    top = None
    if isinstance(evaluator, optuna.importance.PedAnovaImportanceEvaluator):
        top = math.ceil(_quantile(len(feasible)) * len(feasible))  # Optuna's cut (trials tied with the last join it too)
    return Importance(dict(found), type(evaluator).__name__, len(feasible), top)
