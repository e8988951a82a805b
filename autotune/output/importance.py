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
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from autotune.records import TrialRecord
from autotune.train_setup import KNOBS

#: Fewer measured trials than this and the importances are mostly noise.
FEW_TRIALS = 10


@dataclass(frozen=True)
class Importance:
    """Knob importances (summing to 1) and how they were computed.

    Attributes:
        values: Importance per knob that varied, largest first.
        evaluator: The Optuna evaluator's name.
        trials: Trials they rest on (feasible and pruned).
        caveat: One line the reader must see first, or None.
    """

    values: dict[str, float]
    evaluator: str
    trials: int
    caveat: str | None


def _evaluator() -> optuna.importance.BaseImportanceEvaluator:
    if importlib.util.find_spec("sklearn") is not None:
        return optuna.importance.FanovaImportanceEvaluator(seed=0)
    return optuna.importance.PedAnovaImportanceEvaluator()


def _value(record: TrialRecord, knob: str) -> object:
    value = getattr(record.setup, knob)
    return 0 if value is None else value  # prefetch_factor without workers


def knob_importance(records: Sequence[TrialRecord]) -> Importance | None:
    """The importance of each knob that varied among the measured trials; None if none can be computed.

    The PyTorch defaults' trial is left out: it is the baseline, not a point of the searched space, and often
    lies outside the user's ``--set`` pins (with it, a pinned knob would be credited with the pin's effect).
    """
    feasible = [r for r in records if r.result.status in ("ok", "pruned") and r.result.samples_per_s and r.reused_from is None
                and r.role != "defaults"]
    varied = [k for k in KNOBS if len({_value(r, k) for r in feasible}) > 1]
    if len(feasible) < 3 or not varied:
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
    evaluator = _evaluator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = optuna.importance.get_param_importances(study, evaluator=evaluator, normalize=True)
    caveat = None
    if len(feasible) < FEW_TRIALS:
        caveat = (
            f"only {len(feasible)} measured trials: importances from so few points are rough; "
            f"read them as a hint, not a ranking (about {FEW_TRIALS}+ are needed)"
        )
    return Importance(dict(found), type(evaluator).__name__, len(feasible), caveat)
