"""Elections among the workers of a shared study: the lowest-numbered live marker wins.

A marker is a FAIL-state trial carrying :data:`~autotune.tuner.study.ATTR_MARKER` (the election's kind) and
:data:`~autotune.tuner.study.ATTR_WORKER` (who entered). Optuna numbers trials in creation order under a lock on the
study row (RDB) or in log order (journal), so every worker that reads the markers sees the same winner. A marker
whose worker is gone (a dead pid on this host; on another host, one that neither entered it nor stamped the study
(:meth:`~autotune.tuner.lock.Holder.refreshed`) within :data:`~autotune.tuner.lock.STALE_AFTER_S`, or longer
where one run may take longer) is passed over:
the elected worker stamps the study with every calibration run and confirmation measurement it stores, so a
calibration or confirmation that takes longer than that keeps its marker.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.tuner.lock import STALE_AFTER_S, Holder
from autotune.tuner.study import ATTR_MARKER, ATTR_WORKER


def enter(study: optuna.Study, me: Holder, kind: str, attrs: dict[str, Any] | None = None,
          stale_after: float = STALE_AFTER_S) -> tuple[Holder, FrozenTrial]:
    """Enter the election ``kind`` once (with ``attrs`` on the marker) and return its winner and the winner's marker
    (one on another host counts as alive while it stamped within ``stale_after``: longer than one run can take).

    Not retried here: the caller wraps it in the storage's retries, with interrupts held (a marker is added whole).
    """

    def markers() -> list[tuple[Holder, FrozenTrial]]:
        trials = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        found = sorted((t for t in trials if t.user_attrs.get(ATTR_MARKER) == kind), key=lambda t: t.number)
        attrs = study.user_attrs
        return [(h.refreshed(attrs), t) for t in found if (h := Holder.from_dict(t.user_attrs.get(ATTR_WORKER))) is not None]

    found = markers()
    if not any(me.same_process(h) for h, _ in found):
        study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={**(attrs or {}), ATTR_MARKER: kind,
                                                                                ATTR_WORKER: me.to_dict()}))
        found = markers()
    return next((h, t) for h, t in found if h.alive(stale_after=stale_after) or me.same_process(h))
