"""What ``torch.compile`` does to a training step on this machine: eager against compiled, interleaved.

Usage: ``python -m benchmarks.compile_cpu [--model resnet18] [--image-size 64] [--rounds 2] [--mode default]``

Each round runs the eager setup, then the same setup compiled, as isolated
trials of :func:`autotune.runner.run_trial`. Printed: each round's samples/s,
the medians, ``compile_s`` (the first compiled step) and the break-even step
count (``compile_s`` over the step time saved).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

from autotune.records import TrialOptions, Workload
from autotune.train_setup import TrainSetup
from autotune.workloads.data import ensure_synthetic
from benchmarks.threads import interleaved


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print; return the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trial-seconds", type=float, default=5.0)
    parser.add_argument("--mode", default="default", help="torch.compile mode")
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    workload = Workload(model=args.model, image_size=args.image_size, data=str(ensure_synthetic(args.cache_dir, 2000)))
    eager = TrainSetup(batch_size=args.batch_size)
    setups = [eager, eager.replace(compile=args.mode)]
    results = interleaved(setups, workload, TrialOptions(trial_seconds=args.trial_seconds, windows=4), args.rounds)
    for setup, runs in zip(setups, results, strict=True):
        shown = ", ".join(f"{r.samples_per_s:.1f}" if r.ok and r.samples_per_s else f"{r.status}: {r.error}" for r in runs)
        compile_s = [f"{r.compile_s:.1f}" for r in runs if r.compile_s is not None]
        print(f"{setup.describe():32s} samples/s per round: {shown}" + (f" | compile_s: {', '.join(compile_s)}" if compile_s else ""))
    rates = [[r.samples_per_s for r in runs if r.ok and r.samples_per_s] for runs in results]
    steps = [[r.step_time_s for r in runs if r.ok and r.step_time_s] for runs in results]
    if all(rates) and all(steps):
        saved = statistics.median(steps[0]) - statistics.median(steps[1])
        compile_s = statistics.median(r.compile_s for r in results[1] if r.compile_s is not None)
        ratio = statistics.median(rates[1]) / statistics.median(rates[0])
        pays = f"after {compile_s / saved:.0f} steps" if saved > 0 else "never (no step time saved)"
        print(f"compiled / eager: {ratio:.2f}x; compile_s median {compile_s:.1f} s; pays off {pays}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
