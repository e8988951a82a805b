"""Wall time of a trial started from the zygote vs a fresh interpreter.

Usage: ``python -m benchmarks.trial_startup [--rounds 3] [--trial-seconds 3] [--search OUT_DIR]``

Runs the same trial (resnet18 at 64 px, batch 64, 1 worker, bf16; with
``--search``, the winner of that search output's ``best.json`` on its
workload) alternately through the warm zygote and with one interpreter per
trial (the fallback), interleaved A B A B, and prints the median wall time of
each, what share of it was measured steady state, and the median samples/s
(whether a forked trial trains at the speed of a fresh process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from autotune.records import TrialOptions, Workload
from autotune.runner import run_trial, zygote
from autotune.train_setup import TrainSetup
from autotune.workloads.data import ensure_synthetic


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=3.0)
    parser.add_argument("--search", type=Path, default=None, help="a search output directory: time its winner")
    args = parser.parse_args()
    if args.search is not None:
        from benchmarks.emitted_vs_search import search_output

        found = search_output(args.search)
        if found is None:
            sys.exit(1)
        workload, setup = found[0].workload, found[0].setup
    else:
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
    rates: dict[str, list[float]] = {"zygote": [], "fresh interpreter": []}
    for _ in range(args.rounds):
        for name, server in (("zygote", warm), ("fresh interpreter", fallback)):
            zygote._ZYGOTE = server
            began = time.monotonic()
            result = run_trial(setup, workload, options)
            walls[name].append(time.monotonic() - began)
            measured[name].append(result.measured_s or 0.0)
            rates[name].append(result.samples_per_s or 0.0)
    zygote._ZYGOTE = warm
    for name in walls:
        wall = statistics.median(walls[name])
        share = statistics.median(measured[name]) / wall
        print(f"{name:18s} wall {wall:5.2f} s per trial (range {min(walls[name]):.2f}-{max(walls[name]):.2f}), "
              f"measured share {share:.0%}, {statistics.median(rates[name]):.1f} samples/s "
              f"({', '.join(f'{r:.0f}' for r in rates[name])})")
    ratios = [f / z for z, f in zip(rates["zygote"], rates["fresh interpreter"], strict=True) if z and f]
    print(f"fresh interpreter / zygote per round: {', '.join(f'{r:.3f}' for r in ratios)}")


if __name__ == "__main__":
    main()
