"""Confirmation: re-measure the best candidates interleaved (A B C A B C).

A single measurement on a shared machine varies by 20-30 %; ranking close
setups by one run picks noise. The finalists (and the PyTorch defaults, for
the speedup) are measured again in rounds, each round running every
candidate once, and compared by their medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune import trial as _trial
from autotune.config import TrainSetup
from autotune.trial import TrialOptions, TrialResult
from autotune.workload import Workload


@dataclass(frozen=True)
class Candidate:
    """A setup to confirm, with the roles it played in the search."""

    key: str
    setup: TrainSetup
    label: str


@dataclass(frozen=True)
class Confirmed:
    """A candidate's confirmation measurements."""

    candidate: Candidate
    values: tuple[float, ...]
    failures: tuple[str, ...]

    @property
    def median(self) -> float | None:
        """Median of the successful measurements."""
        return float(statistics.median(self.values)) if self.values else None

    @property
    def spread(self) -> float | None:
        """Range (max - min) of the successful measurements."""
        return float(max(self.values) - min(self.values)) if self.values else None


Store = Callable[[str, list[float], list[str]], None]
Measure = Callable[[TrainSetup, Workload, TrialOptions], TrialResult]


def confirm(
    candidates: Sequence[Candidate],
    workload: Workload,
    options: TrialOptions,
    *,
    rounds: int,
    known: dict[str, tuple[list[float], list[str]]],
    store: Store,
    on_measure: Callable[[int, int, Candidate, TrialResult], None] = lambda *_: None,
    runner: Measure | None = None,
) -> list[Confirmed]:
    """Measure every candidate ``rounds`` times, interleaved.

    Measurements already in ``known`` (from an interrupted run) count; only
    the missing ones run. ``store`` is called after every measurement so none
    is lost.
    """
    runner = runner or _trial.run_trial
    values = {c.key: list(known.get(c.key, ([], []))[0]) for c in candidates}
    failures = {c.key: list(known.get(c.key, ([], []))[1]) for c in candidates}
    total = sum(max(0, rounds - len(values[c.key]) - len(failures[c.key])) for c in candidates)
    done = 0
    for round_index in range(rounds):
        for candidate in candidates:
            if len(values[candidate.key]) + len(failures[candidate.key]) > round_index:
                continue
            result = runner(candidate.setup, workload, options)
            if result.ok and result.samples_per_s is not None:
                values[candidate.key].append(result.samples_per_s)
            else:
                failures[candidate.key].append(f"{result.status}: {result.error}")
            store(candidate.key, values[candidate.key], failures[candidate.key])
            done += 1
            on_measure(done, total, candidate, result)
    return [Confirmed(c, tuple(values[c.key]), tuple(failures[c.key])) for c in candidates]
