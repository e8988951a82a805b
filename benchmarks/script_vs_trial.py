"""The emitted train.py against a trial of the same setup, interleaved in one run.

    python -m benchmarks.script_vs_trial OUT_DIR [--rounds 3] [--trial-seconds 3] [--steps 14] [--also OTHER_TRAIN_PY]

Reads ``OUT_DIR/best.json``; each round runs one trial of the winning setup
(a fresh process, as in the search) and then ``OUT_DIR/train.py`` (and any
``--also`` script: another version of it), one after the other, so every
figure of a round ran under the same load. The script's figure is its
steady-state images over seconds (:func:`benchmarks.emitted_vs_search.steady_rate`,
epoch starts counted as often as they happen); the median of its log lines
and the lines themselves are printed too, since their spread shows what an
epoch boundary costs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="a search output directory (best.json + train.py)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--trial-seconds", type=float, default=3.0, help="measured seconds of each trial")
    parser.add_argument("--steps", type=int, default=14, help="optimizer steps of each script run (one log line per step)")
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
    for round_ in range(1, args.rounds + 1):
        result = run_trial(best.setup, best.workload, options)
        value = f"{result.samples_per_s:.1f} samples/s" if result.ok and result.samples_per_s else f"{result.status}: {result.error}"
        print(f"round {round_} trial: {value}", flush=True)
        for script in scripts:
            run = run_script(script, steps=args.steps, print_freq=1, warmup_logs=2)
            if run.rate is None:
                print(f"round {round_} {script}: {run.error}", flush=True)
                continue
            lines = ", ".join(f"{r:.0f}" for r in run.rates)
            print(f"round {round_} {script}: {run.rate:.1f} images/s (median line {run.median:.1f}; lines {lines})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
