"""A 2-rank gloo DDP trial against a 1-rank trial on the same CPU cores, same effective batch.

Usage: ``python -m benchmarks.ddp_cpu [--rounds 3] [--trial-seconds 5]``

Runs resnet18 at 64 px on the synthetic JPEGs, bf16, one loader worker per
rank, effective batch 64 either way: one rank with batch 64 on every usable
core (left unpinned as a plain trial is, and pinned to the cores), or two
ranks with batch 32, each pinned to its half of the cores.
The two run interleaved (A B A B ...) and the median samples/s of each is
printed, with the worst rank's data wait. A CPU figure: on a GPU host the
ranks would each have a device of their own.
"""

from __future__ import annotations

import argparse
import statistics

from autotune.records import TrialOptions, Workload
from autotune.runner import run_trial
from autotune.train_setup import TrainSetup
from autotune.tuner.placement import usable_core_ids
from autotune.workloads.data import ensure_synthetic


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=5.0)
    args = parser.parse_args()
    import probes

    cores = usable_core_ids(int(probes.collect().cpu.usable_cores))
    ensure_synthetic(None, 2000)
    workload = Workload(model="resnet18", image_size=64, num_classes=10, images=2000)
    base = TrainSetup(num_workers=1, prefetch_factor=2, persistent_workers=True, amp="bf16")
    runs = {
        "1 rank, batch 64, not pinned": (base.replace(batch_size=64), 1, ()),
        "1 rank, batch 64, pinned to the cores": (base.replace(batch_size=64), 1, cores),
        "2 ranks (gloo), batch 32 each, a core each": (base.replace(batch_size=32), 2, cores),
    }
    values: dict[str, list[float]] = {name: [] for name in runs}
    waits: dict[str, list[float]] = {name: [] for name in runs}
    run_trial(base, workload, TrialOptions(trial_seconds=1.0, windows=2))  # start the zygote outside the measurement
    for round_ in range(args.rounds):
        for name, (setup, world, pinned) in runs.items():
            options = TrialOptions(trial_seconds=args.trial_seconds, world_size=world, cores=pinned)
            result = run_trial(setup, workload, options)
            print(f"round {round_ + 1} {name}: {result.status} {result.samples_per_s or 0:.1f} samples/s", flush=True)
            if result.ok and result.samples_per_s:
                values[name].append(result.samples_per_s)
                waits[name].append(result.data_wait_fraction or 0.0)
    print(f"cores {list(cores)}; {args.rounds} interleaved rounds of {args.trial_seconds:g} s trials")
    for name in runs:
        if values[name]:
            print(
                f"{name}: median {statistics.median(values[name]):.1f} samples/s "
                f"(range {min(values[name]):.1f}-{max(values[name]):.1f}), worst-rank data wait "
                f"{statistics.median(waits[name]):.0%}"
            )


if __name__ == "__main__":
    main()
