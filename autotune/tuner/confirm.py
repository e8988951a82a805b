"""Confirmation: re-measure the best candidates interleaved (A B C A B C).

A single measurement on a shared machine varies by 20-30 %; ranking close
setups by one run picks noise. The finalists (and the PyTorch defaults, for
the speedup) are measured again in rounds, each round running every
candidate once, and compared by their medians.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autotune.records import Candidate, Confirmed, TrialOptions, TrialRecord, TrialResult, Workload
from autotune.runner import TrialRunner, run_trial
from autotune.train_setup import TrainSetup

Store = Callable[[str, list[float], list[str]], None]


def confirm(
    candidates: Sequence[Candidate],
    workload: Workload,
    options: TrialOptions,
    *,
    rounds: int,
    known: dict[str, tuple[list[float], list[str]]],
    store: Store,
    on_measure: Callable[[int, int, Candidate, TrialResult], None] = lambda *_: None,
    runner: TrialRunner = run_trial,
) -> list[Confirmed]:
    """Measure every candidate ``rounds`` times, interleaved.

    Measurements already in ``known`` (from an interrupted run) count; only
    the missing ones run. ``store`` is called after every measurement so none
    is lost.
    """
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


def pick_candidates(feasible: Sequence[TrialRecord], defaults: TrainSetup, top: int) -> list[Candidate]:
    """The ``top`` fastest distinct setups, then the defaults (when they ran) for the speedup."""
    ranked = sorted(feasible, key=lambda r: r.result.samples_per_s or 0.0, reverse=True)
    candidates: list[Candidate] = []
    seen: set[str] = set()
    for record in ranked:
        key = record.setup.to_json()
        if key in seen:
            continue
        seen.add(key)
        candidates.append(Candidate(key, record.setup, f"#{record.number} {record.setup.describe()}"))
        if len(candidates) == top:
            break
    default_key = defaults.to_json()
    if default_key not in seen and any(r.setup.to_json() == default_key for r in feasible):
        candidates.append(Candidate(default_key, defaults, f"defaults {defaults.describe()}"))
    return candidates
