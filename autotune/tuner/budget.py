"""How a study's trials count toward ``--trials``.

Every place that asks "is the budget spent?" (the search loop, the shared
study's workers, the queued refinements, ``autotune status``) counts the same
way, from trials it has already read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.records import TrialRecord

#: Nothing ran for this trial (a setup measured before, or one the data cannot feed): see :func:`counted_toward_budget`.
ATTR_FREE = "free"

#: The study attribute holding the latest ``--trials`` a search ran for (``autotune status`` reads it).
STUDY_BUDGET = "trials"

#: The study attribute holding the largest ``--trials`` a worker of a shared study searched for (``autotune status`` says
#: a worker searched past the stored budget only where one did).
STUDY_LARGEST_BUDGET = "largest_trials"

#: Trials that count toward ``--trials`` (free ones only beyond a limit: :func:`counted_toward_budget`).
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def counted_toward_budget(trials: Iterable[FrozenTrial], wanted: int | None) -> int:
    """How many of the finished ``trials`` count toward a budget of ``wanted``.

    A free trial measured nothing: the sampler proposed a setup measured before
    (its measurement is told again, so the sampler learns) or one the data
    cannot feed (known before running, or by running for a stream of unknown length). It does not use up the budget, so ``--trials 30`` means 30
    measurements, until there are more than ``wanted`` free trials: a sampler
    that keeps proposing measured setups has converged, and the search ends
    after at most ``2 x wanted`` trials. Without ``wanted`` every finished
    trial counts.
    """
    finished = [t for t in trials if t.state in FINISHED]
    free = sum(bool(t.user_attrs.get(ATTR_FREE)) for t in finished)
    if wanted is None:
        return len(finished)
    return len(finished) - free + max(0, free - wanted)


def progress(trials: Sequence[FrozenTrial], wanted: int | None) -> tuple[int, int]:
    """Of ``trials`` (read once): the finished ones that count toward ``wanted`` (:func:`counted_toward_budget`), and the running ones."""
    return counted_toward_budget(trials, wanted), sum(t.state == TrialState.RUNNING for t in trials)


def counted_records(records: Iterable[TrialRecord]) -> int:
    """Finished trials for messages: every one but the free ones (:func:`counted_toward_budget` also counts a converged
    sampler's free trials beyond the budget, which this leaves out)."""
    return sum(not r.free for r in records)


def store_budget(study: optuna.Study, wanted: int) -> None:
    """Store a worker's ``--trials`` as the study's budget (:data:`STUDY_BUDGET`), and as the largest one
    (:data:`STUDY_LARGEST_BUDGET`) where it is."""
    study.set_user_attr(STUDY_BUDGET, wanted)
    if wanted > (study.user_attrs.get(STUDY_LARGEST_BUDGET) or 0):
        study.set_user_attr(STUDY_LARGEST_BUDGET, wanted)
