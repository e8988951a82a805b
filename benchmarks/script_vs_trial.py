"""The emitted train.py against a trial of the same setup, interleaved in one run.

    python -m benchmarks.script_vs_trial OUT_DIR [--rounds 3] [--trial-seconds 3] [--steps 14] [--print-freq 1] [--also OTHER_TRAIN_PY]

Reads ``OUT_DIR/best.json``; each round runs one trial of the winning setup
(a fresh process, as in the search) and then ``OUT_DIR/train.py`` (and any
``--also`` script: another version of it), one after the other, so every
figure of a round ran under the same load. The script's figure is its
steady-state images over seconds (:func:`benchmarks.emitted_vs_search.steady_rate`,
epoch starts counted as often as they happen); the median of its log lines
and the lines themselves are printed too, since their spread shows what an
epoch boundary costs. The last lines give each script's median over the
rounds and its per-round ratio to the trial (the same-run ratio the
benchmark's ``emitted`` goal uses; ``--steps 64 --print-freq 8`` is what
``benchmarks.run`` gives a pick near 590 samples/s at batch 64), and the
same ratio to the trial's samples over seconds (its windows together, the
script's kind of figure) next to its median window.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="a search output directory (best.json + train.py)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--trial-seconds", type=float, default=3.0, help="measured seconds of each trial")
    parser.add_argument("--steps", type=int, default=14, help="optimizer steps of each script run")
    parser.add_argument("--print-freq", type=int, default=1, help="optimizer steps per logged window of the script")
    parser.add_argument("--also", type=Path, action="append", default=[], help="another train.py to run each round")
    args = parser.parse_args(argv)

    from autotune.records import TrialOptions
    from autotune.runner import run_trial
    from benchmarks.emitted_vs_search import run_script, search_output

    found = search_output(args.out_dir)
    if found is None:
        return 1
    best, script = found
    scripts = [script, *args.also]
    missing = [str(s) for s in args.also if not s.is_file()]
    if missing:
        print(f"error: no such script: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"setup: {best.setup.describe()} ({best.workload.model} at {best.workload.image_size} px)", flush=True)
    options = TrialOptions(trial_seconds=args.trial_seconds)
    trials: list[float | None] = []
    # The trial's value is its median window; the script's figure is images over seconds.
    # The trial's own samples over seconds shows how much of a gap is that difference.
    overall: list[float | None] = []
    rates: dict[Path, list[float | None]] = {script: [] for script in scripts}
    for round_ in range(1, args.rounds + 1):
        result = run_trial(best.setup, best.workload, options)
        trials.append(result.samples_per_s if result.ok else None)
        overall.append(result.samples / result.measured_s if result.ok and result.samples and result.measured_s else None)
        value = (
            f"{result.samples_per_s:.1f} samples/s (samples over seconds {overall[-1]:.1f})"
            if result.ok and result.samples_per_s and overall[-1]
            else f"{result.status}: {result.error}"
        )
        print(f"round {round_} trial: {value}", flush=True)
        for script in scripts:
            run = run_script(script, steps=args.steps, print_freq=args.print_freq, warmup_logs=2)
            rates[script].append(run.rate)
            if run.rate is None:
                print(f"round {round_} {script}: {run.error}", flush=True)
                continue
            lines = ", ".join(f"{r:.0f}" for r in run.rates)
            print(f"round {round_} {script}: {run.rate:.1f} images/s (median line {run.median:.1f}; lines {lines})", flush=True)
    print(f"trial: median {_median(trials)} (samples over seconds: median {_median(overall)})", flush=True)
    for script, values in rates.items():
        print(f"{script}: median {_median(values)}")
        for name, reference in (("trial", trials), ("trial's samples over seconds", overall)):
            ratios = [v / t for v, t in zip(values, reference, strict=True) if v and t]
            shown = ", ".join(f"{r:.3f}" for r in ratios)
            below = sum(r < 1.0 for r in ratios)
            middle = f"median {statistics.median(ratios):.3f}; " if ratios else ""
            print(f"  per round / {name}: {middle}{shown} (below in {below} of {len(ratios)})")
    return 0


def _median(values: list[float | None]) -> str:
    measured = [v for v in values if v]
    return f"{statistics.median(measured):.1f}" if measured else "none"


if __name__ == "__main__":
    sys.exit(main())
