"""How a search reports progress: the :class:`Reporter` protocol.

The search calls these hooks; the CLI's Rich reporter
(:class:`autotune.render.RichReporter`) draws them, and library users pass
their own or get :class:`SilentReporter`.
"""

from __future__ import annotations

from typing import Protocol

from autotune.errors import UsageError
from autotune.records import TrialRecord, TrialResult
from autotune.train_setup import TrainSetup


class Reporter(Protocol):
    """Progress hooks of a search."""

    def message(self, text: str) -> None:
        """A line of progress information."""

    def trial_started(self, done: int, total: int, role: str, setup: TrainSetup) -> None:
        """A trial begins (``done`` finished so far, ``total`` wanted)."""

    def trial_finished(self, done: int, total: int, record: TrialRecord, best: float | None) -> None:
        """A trial finished; ``best`` is the fastest feasible samples/s so far."""

    def confirm_progress(self, done: int, total: int, label: str, result: TrialResult) -> None:
        """A confirmation measurement finished."""


class SilentReporter:
    """A reporter that shows nothing (the library default)."""

    def message(self, text: str) -> None:
        """Ignored."""

    def trial_started(self, done: int, total: int, role: str, setup: TrainSetup) -> None:
        """Ignored."""

    def trial_finished(self, done: int, total: int, record: TrialRecord, best: float | None) -> None:
        """Ignored."""

    def confirm_progress(self, done: int, total: int, label: str, result: TrialResult) -> None:
        """Ignored."""


#: The hooks a search calls.
HOOKS = ("message", "trial_started", "trial_finished", "confirm_progress")


def check_reporter(reporter: object) -> None:
    """Refuse a ``reporter`` that lacks a hook of :class:`Reporter`, before the search starts (None is none).

    Raises:
        UsageError: Naming the hooks it lacks.
    """
    if reporter is None:
        return
    missing = [name for name in HOOKS if not callable(getattr(reporter, name, None))]
    if missing:
        raise UsageError(f"reporter must have the methods of autotune.tuner.Reporter ({', '.join(HOOKS)}); "
                         f"{type(reporter).__name__} lacks {', '.join(missing)}")
