"""How long a worker of a shared study waits for the elected one (:class:`~autotune.tuner.workers.Crew`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.records import TrialOptions


@dataclass
class Patience:
    """How long a waiting worker still waits: :attr:`wait_s` from the last change it saw in the study.

    The elected worker stores every calibration run and every confirmation
    measurement the moment it returns (study user attributes), so a change
    there means it is at work: a long calibration or confirmation is waited
    for, a worker that stopped storing anything is not.

    Attributes:
        wait_s: Seconds without a change before the wait ends.
        clock: The monotonic clock it reads.
    """

    wait_s: float
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, Any] | None = None
    _deadline: float = 0.0

    def saw(self, attrs: dict[str, Any]) -> None:
        """Look at the study's user attributes: a change (or the first look) starts the wait again."""
        if self._seen is None or attrs != self._seen:
            self._seen, self._deadline = attrs, self.clock() + self.wait_s

    def over(self) -> bool:
        """Whether :attr:`wait_s` passed since the last change."""
        return self.clock() > self._deadline


def patience_s(trial_seconds: float, timeout_s: float | None) -> float:
    """How long a worker waits for the elected one to store its next calibration run or confirmation measurement.

    Long enough for one run that ends at its timeout, twice over (the winner's two ceiling runs come between the
    last confirmation measurement and the stored winner), and never under 10 minutes or 60 trial lengths.
    """
    timeout = TrialOptions(trial_seconds=trial_seconds, timeout_s=timeout_s).effective_timeout_s
    return max(600.0, 60.0 * trial_seconds, 2.0 * timeout + 60.0)
