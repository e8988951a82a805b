"""A trial's measured peak memory alone and beside held trials (why a held round reports no peak).

Usage: ``python -m benchmarks.held_peaks [--repeats 2] [--trial-seconds 2]``

A held trial (:class:`autotune.runner.held.HeldTrials`) keeps the pages the
trial server's imports left to every trial it forks, shared with the trial
measured next; the summed PSS of that trial counts a shared page 1/n in each
of its n holders, so it reads lower beside held trials than alone. Runs one
setup of :mod:`benchmarks.held_rounds` (bs=128, one loader worker, bf16) in a
fresh process alone, then beside the defaults held, then beside the defaults
and the other two finalists held, ``--repeats`` times, and prints each peak
and its ratio to the run alone before it.
"""

from __future__ import annotations

import argparse

from autotune.runner import run_trial
from autotune.runner.held import HeldTrials
from autotune.units import format_bytes
from benchmarks.held_rounds import SETUPS, prepared


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trial-seconds", type=float, default=2.0)
    args = parser.parse_args()
    workload, options = prepared(args.trial_seconds)
    for repeat in range(args.repeats):
        alone = run_trial(SETUPS["w1"], workload, options).peak_memory_bytes or 0
        line = [f"alone {format_bytes(alone)}"]
        for others in (("defaults",), ("defaults", "w2pf7x2", "w2")):
            held = HeldTrials()
            with held.holding():
                for name in others:
                    held(SETUPS[name], workload, options)
                beside = run_trial(SETUPS["w1"], workload, options).peak_memory_bytes or 0
                line.append(f"beside {len(held._held)} held {format_bytes(beside)} ({beside / alone:.3f}x)")
        print(f"repeat {repeat + 1}: " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()
