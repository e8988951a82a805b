"""Elections among the workers of a shared study: the lowest-numbered live marker wins.

A marker is a FAIL-state trial carrying :data:`~autotune.tuner.study.ATTR_MARKER` (the election's kind) and
:data:`~autotune.tuner.study.ATTR_WORKER` (who entered). Optuna numbers trials in creation order under a lock on the
study row (RDB) or in log order (journal), so every worker that reads the markers sees the same winner. A marker
whose worker is gone (a dead pid on this host; on another host, one that neither entered it nor stamped the study
(:meth:`~autotune.tuner.lock.Holder.refreshed`) within :data:`~autotune.tuner.lock.STALE_AFTER_S`, or longer
where one run may take longer) is passed over:
the elected worker stamps the study with every calibration run and confirmation measurement it stores, so a
calibration or confirmation that takes longer than that keeps its marker. A worker that leaves the search in an
orderly way (done, an error, Ctrl-C or SIGTERM) withdraws (:func:`withdraw`): its markers are passed over at once on
every host, so a worker waiting for its work, or the rerun of a search command, takes over without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.tuner.lock import GONE, STALE_AFTER_S, Holder
from autotune.tuner.signals import interrupts_held
from autotune.tuner.study import ATTR_MARKER, ATTR_WORKER


def enter(study: optuna.Study, me: Holder, kind: str, attrs: dict[str, Any] | None = None,
          stale_after: float = STALE_AFTER_S) -> tuple[Holder, FrozenTrial]:
    """Enter the election ``kind`` once (with ``attrs`` on the marker) and return its winner and the winner's marker
    (one on another host counts as alive while it stamped within ``stale_after``: longer than one run can take).

    Not retried here: the caller wraps it in the storage's retries, with interrupts held (a marker is added whole).
    """

    def markers() -> list[tuple[Holder, FrozenTrial]]:
        return _markers(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)), study.user_attrs, kind)

    if study.user_attrs.get(me.alive_key()) == GONE:  # an earlier search of this process (the API, tests) withdrew it
        study.set_user_attr(me.alive_key(), time.time())
    found = markers()
    if not any(me.same_process(h) for h, _ in found):
        study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={**(attrs or {}), ATTR_MARKER: kind,
                                                                                ATTR_WORKER: me.to_dict()}))
        found = markers()
    return next((h, t) for h, t in found if h.alive(stale_after=stale_after) or me.same_process(h))


def _markers(trials: Sequence[FrozenTrial], attrs: dict[str, Any], kind: str) -> list[tuple[Holder, FrozenTrial]]:
    """The markers of election ``kind`` among ``trials``, lowest number first, each worker refreshed by its stamp in the
    study's user attributes ``attrs``."""
    found = sorted((t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get(ATTR_MARKER) == kind), key=lambda t: t.number)
    return [(h.refreshed(attrs), t) for t in found if (h := Holder.from_dict(t.user_attrs.get(ATTR_WORKER))) is not None]


def acting(trials: Sequence[FrozenTrial], attrs: dict[str, Any], kind: str, stale_after: float = STALE_AFTER_S) -> Holder | None:
    """The worker doing the work of election ``kind`` now, as a process that enters no election reads it (``autotune
    status``): the lowest-numbered marker alive as seen here, unless that worker still sees an earlier one alive and
    waits for it (a dead worker of this host, seen from another host, lives by its heartbeat). None: no worker does it
    (the elected one stopped, and the others wait for it or are gone).

    Args:
        trials: The study's trials.
        attrs: The study's user attributes (the workers' stamps).
        kind: The election.
        stale_after: How long a stamp keeps a worker of another host alive.
    """
    holders = [h for h, _ in _markers(trials, attrs, kind)]
    for index, holder in enumerate(holders):
        if holder.alive(stale_after=stale_after):
            waits = any(h.alive(stale_after=stale_after, seen_from=holder.host) for h in holders[:index])
            return None if waits else holder
    return None


def withdraw(study: optuna.Study, me: Holder) -> None:
    """Stamp ``me`` gone (:data:`~autotune.tuner.lock.GONE`) as it leaves the search: every worker, on any host, then
    passes its markers over at once. Before, a worker on another host counted them alive for 30 minutes: waited for a
    confirmation that never came, and elected the gone worker again on every rerun meanwhile.

    One try, never raising: a worker that leaves because the storage is lost does not wait for it again (its markers
    then age out as a killed worker's do). A stop meanwhile stays remembered, not raised: the search ends anyway.
    """
    try:
        with interrupts_held():
            study.set_user_attr(me.alive_key(), GONE)
    except (KeyboardInterrupt, Exception):  # a stop held meanwhile; whatever a lost storage raises (sqlalchemy's, OSError)
        pass
