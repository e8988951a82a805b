"""Confirmation: re-measure the best candidates interleaved (A B C A B C).

A single measurement on a shared machine varies by 20-30 %; ranking close
setups by one run picks noise. The finalists (and the PyTorch defaults, for
the speedup) are measured again in rounds, each round running every
candidate once, and compared by their medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from autotune.records import Candidate, Ceilings, Confirmed, TrialOptions, TrialRecord, TrialResult, Workload
from autotune.runner import TrialRunner, run_trial
from autotune.train_setup import TrainSetup
from autotune.tuner.noise import settled

Store = Callable[[str, list[float], list[str]], None]


#: Rounds always measured before the ranking may be called settled.
MIN_ROUNDS = 2


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
    min_rounds: int = MIN_ROUNDS,
) -> list[Confirmed]:
    """Measure every candidate in interleaved rounds until the ranking is settled.

    At least ``min_rounds`` (or ``rounds``, if fewer) rounds run; after each
    later round the measuring stops once :func:`autotune.tuner.noise.settled`
    holds (the leader beats or equals every other candidate beyond the
    noise), and at the latest after ``rounds`` rounds.

    Measurements already in ``known`` (from an interrupted run) count; only
    the missing ones run. ``store`` is called after every measurement so none
    is lost.
    """
    values = {c.key: list(known.get(c.key, ([], []))[0]) for c in candidates}
    failures = {c.key: list(known.get(c.key, ([], []))[1]) for c in candidates}
    total = sum(max(0, rounds - len(values[c.key]) - len(failures[c.key])) for c in candidates)
    done = 0

    def results() -> list[Confirmed]:
        return [Confirmed(c, tuple(values[c.key]), tuple(failures[c.key])) for c in candidates]

    for round_index in range(rounds):
        if round_index >= min(min_rounds, rounds) and settled(results()):
            break
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
    return results()


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


def measure_ceilings(
    setup: TrainSetup, workload: Workload, options: TrialOptions, *, rounds: int = 1, runner: TrialRunner = run_trial
) -> Ceilings:
    """The winner's setup in its three modes, interleaved (train, compute, loader per round).

    The bottleneck verdict then compares like with like: the compute-only
    and loader-only rates at the winner's batch, precision, layout and
    workers, measured beside the real loop.
    """
    rates: dict[str, list[float]] = {"train": [], "compute": [], "loader": []}
    waits: list[float] = []
    for _ in range(rounds):
        for mode in rates:
            result = runner(setup, workload, replace(options, mode=mode))  # type: ignore[arg-type]
            if result.ok and result.samples_per_s is not None:
                rates[mode].append(result.samples_per_s)
                if mode == "train" and result.data_wait_fraction is not None:
                    waits.append(result.data_wait_fraction)

    def median(values: list[float]) -> float | None:
        return float(statistics.median(values)) if values else None

    return Ceilings(median(rates["train"]), median(rates["compute"]), median(rates["loader"]), median(waits))
