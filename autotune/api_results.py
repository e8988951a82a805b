"""What the Python API's :func:`~autotune.api.search` and :func:`~autotune.api.trial` return."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.records import TrialResult, Workload
from autotune.train_setup import TrainSetup
from autotune.tuner.config import SearchOutcome

__all__ = ["SearchResult", "TrialOutcome"]


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found.

    Attributes:
        setup: The winner (confirmed unless interrupted; with nothing measured, search raises).
        samples_per_s: Its median throughput in the confirmation rounds.
        speedup: Over the defaults: the median of the per-round ratios of the rounds both ran (``None``: nothing compared
            with them: they were the only setup the confirmation measured, their trial failed, or the search stopped
            before it; ``notes`` says which).
        best_json: The ``best.json`` written.
        train_py: The emitted ``train.py``.
        verdict: Which side limits training, in words.
        outcome: Everything else: every trial, calibration, confirmation.
        notes: What qualifies the figures (the CLI's ``note:`` lines): a busy machine, rounds that disagree with the
            trials, a changed precision or effective batch, an interrupted confirmation.
    """

    setup: TrainSetup
    samples_per_s: float
    speedup: float | None
    best_json: Path
    train_py: Path
    verdict: str
    outcome: SearchOutcome
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrialOutcome:
    """What :func:`trial` measured for one setup.

    Attributes:
        setup: The setup measured.
        workload: The checked workload record.
        result: The measurement (status, samples/s, spread, data wait, peak memory, ...).
    """

    setup: TrainSetup
    workload: Workload
    result: TrialResult

    @property
    def status(self) -> str:
        """``ok``, ``oom``, ``timeout``, ``error``, ``diverged``, ``bad_data`` or ``interrupted``."""
        return self.result.status

    @property
    def samples_per_s(self) -> float | None:
        """Median steady-state throughput (``None`` unless ``ok``)."""
        return self.result.samples_per_s
