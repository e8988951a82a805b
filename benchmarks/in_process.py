"""Loading in the training process against loader workers, at one batch, interleaved.

Usage: ``python -m benchmarks.in_process [--workload text-transformer|resnet18-64] [--rounds 3] [--trial-seconds 5]``

The question behind the search's guess without workers (``autotune.tuner.guesses.in_process_guess``): on a CPU the
workers' loading takes its core-seconds from the training threads, so where items are cheap to load, loading in
turn in the training process may run as fast as beside workers, or faster. Each round runs every setup below as an
isolated trial (A B C ... A B C ...); printed: each setup's median samples/s and its rounds.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

from autotune.records import TrialOptions
from autotune.train_setup import TrainSetup
from benchmarks.threads import interleaved

#: The setups per workload: one batch without workers and with 1 and 2 (the text: the defaults first, two at batch 1024 last).
SETUPS: dict[str, list[TrainSetup]] = {
    "text-transformer": [TrainSetup(), *(TrainSetup(batch_size=256, num_workers=w, prefetch_factor=2 if w else None,
                                                    persistent_workers=bool(w)) for w in (0, 1, 2)),
                         TrainSetup(batch_size=1024), TrainSetup(batch_size=1024, num_workers=1, prefetch_factor=5, persistent_workers=True)],
    "resnet18-64": [TrainSetup(batch_size=128, amp="bf16", channels_last=True, num_workers=w, prefetch_factor=2 if w else None,
                               persistent_workers=bool(w)) for w in (0, 1, 2)],
}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print; return the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=sorted(SETUPS), default="text-transformer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.workload == "text-transformer":
        from benchmarks.run import example_task

        workload = example_task("text_classifier:make_large_task", "cpu")
    else:
        from autotune.workloads import build_workload

        workload = build_workload(model="resnet18", image_size=64, data=None, device="cpu")
    setups = SETUPS[args.workload]
    results = interleaved(setups, workload, TrialOptions(trial_seconds=args.trial_seconds), args.rounds)
    for setup, runs in zip(setups, results, strict=True):
        rates = [r.samples_per_s for r in runs if r.ok and r.samples_per_s]
        median = f"{statistics.median(rates):8.1f}" if rates else "  failed"
        print(f"{setup.describe():48s} {median}  rounds: {', '.join(f'{r:.1f}' for r in rates)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
