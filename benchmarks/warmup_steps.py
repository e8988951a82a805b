"""Per-step times from the first step on: how much warm-up a trial needs.

Usage: ``python -m benchmarks.warmup_steps [--steps 9] [--quick] [--cache-dir DIR]``

Builds each setup exactly as a trial does (in this process, with the trial's
own :class:`autotune.runner.child.TrialLoop`, the synthetic first step included where
there are workers), then times each of the first ``--steps`` warm-up steps
(one micro-batch from the real loader and an optimizer step) and prints them
next to the steady median (steps 3 onwards). A first step far above it is
the lazy initialisation the warm-up absorbs; the second step's ratio tells
whether one warm-up step is enough.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from autotune.records import TrialOptions, Workload
from autotune.runner.child import TrialLoop
from autotune.train_setup import TrainSetup
from autotune.workloads.data import ensure_synthetic
from benchmarks.data import ensure_small_synthetic

CASES: tuple[tuple[str, int, bool, TrainSetup], ...] = (
    ("resnet18", 64, False, TrainSetup(batch_size=128, amp="bf16", channels_last=True)),
    ("resnet18", 64, False, TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2, persistent_workers=True,
                                       amp="bf16", channels_last=True)),
    ("mobilenet_v3_small", 64, False, TrainSetup(batch_size=128, num_workers=1, prefetch_factor=2,
                                                 persistent_workers=True, amp="bf16", channels_last=True)),
    ("resnet50", 128, True, TrainSetup(batch_size=32)),
    ("resnet50", 128, True, TrainSetup(batch_size=32, amp="bf16", channels_last=True)),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print; return the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="resnet18 at 32 px on 64 images, 4 steps")
    parser.add_argument("--cache-dir", type=Path, default=None, help="synthetic data (default: autotune's cache)")
    args = parser.parse_args(argv)
    cases = CASES
    steps = args.steps
    if args.quick:
        cases = (("resnet18", 32, False, TrainSetup(batch_size=8, num_workers=1, prefetch_factor=2)),)
        steps = 4
    for model, size, small, setup in cases:
        if small:
            data = ensure_small_synthetic(args.cache_dir, 2000, 160, 120)
        else:
            data = ensure_synthetic(args.cache_dir, 64 if args.quick else 2000)
        workload = Workload(model=model, image_size=size, data=str(data))
        runner = TrialLoop(setup, workload, TrialOptions(), started=time.perf_counter(), send=lambda event: None)
        work = runner.unit_for_mode()
        times = []
        for _ in range(steps):
            began = time.perf_counter()
            work.warmup_step()
            times.append(time.perf_counter() - began)
        runner.monitor.stop()
        warmup = work.warmup_steps
        del work, runner  # the loader iterator, and with it the workers
        steady = statistics.median(times[2:]) if len(times) > 2 else times[-1]
        ratios = " ".join(f"{t / steady:.2f}" for t in times)
        print(f"{model:18s} {size:3d}px {setup.describe():40s} warm-up {warmup} | steady {steady:.3f} s | "
              f"step / steady: {ratios}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
