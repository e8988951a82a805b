"""Wall time of a trial started from the zygote vs a fresh interpreter.

Usage: ``python -m benchmarks.trial_startup [--rounds 3] [--trial-seconds 3]``

Runs the same trial (resnet18 at 64 px, batch 64, 1 worker, bf16) alternately
through the warm zygote and with one interpreter per trial (the fallback),
interleaved A B A B, and prints the median wall time of each and what share of
it was measured steady state.
"""

from __future__ import annotations

import argparse
import statistics
import time

from autotune.records import TrialOptions, Workload
from autotune.runner import run_trial, zygote
from autotune.train_setup import TrainSetup
from autotune.workloads.data import ensure_synthetic


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    args = parser.parse_args()
    ensure_synthetic(None, 2000)
    workload = Workload(model="resnet18", image_size=64)
    setup = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2, persistent_workers=True, amp="bf16")
    options = TrialOptions(trial_seconds=args.trial_seconds)
    run_trial(setup, workload, options)  # start the zygote outside the measurement
    fallback = zygote.Zygote()
    fallback.disabled = True
    warm = zygote._ZYGOTE
    walls: dict[str, list[float]] = {"zygote": [], "fresh interpreter": []}
    measured: dict[str, list[float]] = {"zygote": [], "fresh interpreter": []}
    for _ in range(args.rounds):
        for name, server in (("zygote", warm), ("fresh interpreter", fallback)):
            zygote._ZYGOTE = server
            began = time.monotonic()
            result = run_trial(setup, workload, options)
            walls[name].append(time.monotonic() - began)
            measured[name].append(result.measured_s or 0.0)
    zygote._ZYGOTE = warm
    for name in walls:
        wall = statistics.median(walls[name])
        share = statistics.median(measured[name]) / wall
        print(f"{name:18s} wall {wall:5.2f} s per trial (range {min(walls[name]):.2f}-{max(walls[name]):.2f}), "
              f"measured share {share:.0%}")


if __name__ == "__main__":
    main()
