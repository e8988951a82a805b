"""CPU intra-op threads against loader workers: real trials in interleaved rounds.

Usage: ``python -m benchmarks.threads [--rounds 3] [--trial-seconds 4] [--quick] [--cache-dir DIR]
[--task MODULE:FUNCTION --batch N]``

``--task`` measures a user ``Task`` instead of the two image models (its
module is looked up in ``examples/`` too), e.g.
``--task text_classifier:make_large_task --batch 1024``.

Each round runs every setup once, in the same order (A B C D A B C D ...),
each as an isolated trial of :func:`autotune.runner.run_trial`; the table
gives each setup's median samples/s over the rounds and the range (min..max).
``threads=auto`` is torch's own choice (what ``num_threads=None`` leaves);
the setup naming torch's own count explicitly (``threads=N`` for the N
usable cores) shows what ``torch.set_num_threads`` itself changes (it also
switches off MKL's dynamic threading).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

import probes
from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner import run_trial
from autotune.train_setup import TrainSetup
from autotune.workloads.data import ensure_synthetic

#: (workers, threads): torch's default, one thread, a worker beside one or two threads.
SETUPS: tuple[tuple[int, int | None], ...] = ((0, None), (0, 1), (1, 1), (1, 2))
MODELS: tuple[str, ...] = ("resnet18", "mobilenet_v3_small")


def setups_for(usable_cores: int) -> tuple[tuple[int, int | None], ...]:
    """:data:`SETUPS` plus torch's own count named explicitly (0 workers, ``usable_cores`` threads)."""
    explicit = (0, usable_cores)
    return SETUPS if explicit in SETUPS else (SETUPS[0], explicit, *SETUPS[1:])


def setup_for(workers: int, threads: int | None, batch: int) -> TrainSetup:
    """Batch ``batch``, fp32, with ``workers`` loader workers and ``threads`` training threads."""
    return TrainSetup(
        batch_size=batch,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        persistent_workers=workers > 0,
        num_threads=threads,
    )


def interleaved(setups: Sequence[TrainSetup], workload: Workload, options: TrialOptions, rounds: int) -> list[list[TrialResult]]:
    """Each setup's results over ``rounds`` rounds of A B C ..."""
    results: list[list[TrialResult]] = [[] for _ in setups]
    for _ in range(rounds):
        for index, setup in enumerate(setups):
            results[index].append(run_trial(setup, workload, options))
    return results


def summary(results: Sequence[TrialResult]) -> str:
    """``median (min..max)`` of the ok results' samples/s, with the thread count torch used."""
    rates = [r.samples_per_s for r in results if r.ok and r.samples_per_s]
    if not rates:
        return "failed: " + "; ".join(sorted({str(r.error) for r in results}))
    threads = sorted({r.num_threads for r in results if r.num_threads is not None})
    return f"{statistics.median(rates):7.1f} ({min(rates):.1f}..{max(rates):.1f}) [torch threads {threads}]"


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print a Markdown table; return the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true", help="resnet18 at 32 px on 64 images, one round of 1 s trials")
    parser.add_argument("--cache-dir", type=Path, default=None, help="synthetic data (default: autotune's cache)")
    parser.add_argument("--task", default=None, help="a Task factory, MODULE:FUNCTION, instead of the image models")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: 64; 8 with --quick)")
    args = parser.parse_args(argv)
    models, size, images, batch, rounds, seconds = MODELS, 64, 2000, 64, args.rounds, args.trial_seconds
    if args.quick:
        models, size, images, batch, rounds, seconds = ("resnet18",), 32, 64, 8, 1, 1.0
    batch = args.batch or batch
    options = TrialOptions(trial_seconds=seconds, windows=4)
    pairs = setups_for(int(probes.collect().cpu.usable_cores))
    workloads: list[tuple[str, Workload]] = []
    if args.task:
        from benchmarks.run import example_task

        workloads.append((args.task, example_task(args.task, "cpu")))
    else:
        data = ensure_synthetic(args.cache_dir, images)
        workloads += [(f"{model}-{size}", Workload(model=model, image_size=size, data=str(data))) for model in models]
    print(f"| model | workers | threads | samples/s median (range over {rounds} rounds) |")
    print("|---|---|---|---|")
    for name, workload in workloads:
        setups = [setup_for(w, t, batch) for w, t in pairs]
        for (workers, threads), results in zip(pairs, interleaved(setups, workload, options, rounds), strict=True):
            print(f"| {name} | {workers} | {threads or 'auto'} | {summary(results)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
