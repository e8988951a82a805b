"""The confirmation's rounds in fresh trial processes vs held ones (one process per setup, stopped between rounds).

Usage: ``python -m benchmarks.held_rounds [--repeats 2] [--rounds 3] [--trial-seconds 3]``

Runs the same interleaved rounds (A B C D, A B C D, ...) of four setups
(resnet18 at 64 px on 2,000 synthetic JPEGs: the PyTorch defaults and three
bf16 finalists of the README's search) once with a fresh process per run, as
the confirmation did, and once with :class:`autotune.runner.held.HeldTrials`,
alternating the two ``--repeats`` times. Prints the median wall time of each
way's rounds, each setup's median samples/s, and each finalist's median paired
ratio to the defaults (whether holding changes the ranking or the speedup).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner import run_trial
from autotune.runner.held import HeldTrials
from autotune.train_setup import TrainSetup
from autotune.workloads.data import ensure_synthetic

SETUPS = {
    "defaults": TrainSetup(),
    "w1": TrainSetup(batch_size=128, num_workers=1, prefetch_factor=2, persistent_workers=True, amp="bf16", channels_last=True,
                     optimizer_impl="foreach"),
    "w2pf7x2": TrainSetup(batch_size=128, accumulation_steps=2, num_workers=2, prefetch_factor=7, persistent_workers=True, amp="bf16",
                          channels_last=True, optimizer_impl="fused"),
    "w2": TrainSetup(batch_size=128, num_workers=2, prefetch_factor=2, persistent_workers=True, amp="bf16", channels_last=True,
                     optimizer_impl="foreach"),
}


def rounds(runner: Callable[..., TrialResult], block: AbstractContextManager[object], workload: Workload, options: TrialOptions,
           count: int) -> tuple[float, dict[str, list[float]]]:
    """Wall time of ``count`` interleaved rounds of :data:`SETUPS` and each setup's samples/s per round."""
    values: dict[str, list[float]] = {name: [] for name in SETUPS}
    began = time.monotonic()
    with block:
        for _ in range(count):
            for name, setup in SETUPS.items():
                result = runner(setup, workload, options)
                values[name].append(result.samples_per_s or float("nan"))
    return time.monotonic() - began, values


def prepared(trial_seconds: float) -> tuple[Workload, TrialOptions]:
    """resnet18 at 64 px on the 2,000 synthetic JPEGs and trials of ``trial_seconds``, the trial server started."""
    ensure_synthetic(None, 2000)
    workload = Workload(model="resnet18", image_size=64)
    options = TrialOptions(trial_seconds=trial_seconds)
    run_trial(SETUPS["defaults"], workload, options)  # start the trial server outside the measurement
    return workload, options


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    args = parser.parse_args()
    workload, options = prepared(args.trial_seconds)
    walls: dict[str, list[float]] = {"fresh": [], "held": []}
    values: dict[str, dict[str, list[float]]] = {way: {name: [] for name in SETUPS} for way in walls}
    ratios: dict[str, dict[str, list[float]]] = {way: {name: [] for name in SETUPS} for way in walls}
    for _ in range(args.repeats):
        for way in walls:
            held = HeldTrials()
            runner, block = (held, held.holding()) if way == "held" else (run_trial, nullcontext())
            wall, got = rounds(runner, block, workload, options, args.rounds)
            walls[way].append(wall)
            for name, per_round in got.items():
                values[way][name] += per_round
                ratios[way][name] += [v / d for v, d in zip(per_round, got["defaults"], strict=True)]
            print(f"{way}: {wall:.1f} s for {args.rounds} rounds of {len(SETUPS)} setups", flush=True)
    for way in walls:
        print(f"\n{way}: median wall {statistics.median(walls[way]):.1f} s ({', '.join(f'{w:.1f}' for w in walls[way])})")
        for name in SETUPS:
            runs = values[way][name]
            print(f"  {name:9s} {statistics.median(runs):7.1f} samples/s ({min(runs):.1f}-{max(runs):.1f}), "
                  f"{statistics.median(ratios[way][name]):.2f}x the defaults")


if __name__ == "__main__":
    main()
