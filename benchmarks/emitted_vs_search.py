"""Does the emitted train.py reach the throughput the search measured?

    python -m benchmarks.emitted_vs_search OUT_DIR [--steps 60] [--print-freq 5] [--warmup-logs 2]

Reads ``OUT_DIR/best.json``, runs ``OUT_DIR/train.py`` (single process, its
tuned defaults) for a fixed number of optimizer steps, parses its periodic
``step N loss L images/s X`` lines (``samples/s`` for a Task's script), drops the first ``--warmup-logs`` of them
as warm-up, and prints the steady-state images/s and its ratio to
``best.samples_per_s``. The steady-state figure is images over seconds: each
logged interval weighs as many optimizer steps as it covers, so an epoch
boundary's stall counts as often as it happens, as in the trials (a median
of the lines drops it, and on a short epoch that overstates the script). A ratio near 1.0 means the script runs the setup at
the speed the search promised. Exit code 1 when the script fails or logs too
few lines to measure.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_LINE = re.compile(r"^step (\d+) loss (\S+) (?:images|samples)/s ([0-9.]+)\s*$")
#: The script resets its meter after every epoch, at the step this line names.
EPOCH_LINE = re.compile(r"^epoch \d+ done at step (\d+)\b")


def parse_log(text: str) -> list[tuple[int, float]]:
    """``(step, images/s)`` for every periodic log line of train.py's output."""
    rows = []
    for line in text.splitlines():
        match = LOG_LINE.match(line.strip())
        if match:
            rows.append((int(match.group(1)), float(match.group(3))))
    return rows


def steady_state(rows: list[tuple[int, float]], warmup_logs: int) -> list[float]:
    """The images/s values after the warm-up lines."""
    return [rate for _, rate in rows[warmup_logs:]]


def epoch_ends(text: str) -> list[int]:
    """The steps at which train.py logged an epoch's end (and reset its meter)."""
    return [int(m.group(1)) for line in text.splitlines() if (m := EPOCH_LINE.match(line.strip()))]


def steady_rate(rows: list[tuple[int, float]], ends: list[int], warmup_logs: int) -> float | None:
    """Images/s over the steady-state intervals together: their steps over their seconds.

    An interval runs from the previous log line, or from the meter's reset at
    an epoch's end if that came later, to its own line.
    """
    steps = seconds = 0.0
    for i in range(warmup_logs, len(rows)):
        step, rate = rows[i]
        begin = max([rows[i - 1][0] if i else 0, *(end for end in ends if end < step)])
        if step > begin and rate > 0:
            steps += step - begin
            seconds += (step - begin) / rate
    return steps / seconds if seconds else None


@dataclass(frozen=True)
class ScriptRun:
    """What one run of the emitted train.py measured.

    Attributes:
        median: Median steady-state images/s (None: too few log lines or the run failed).
        rates: The steady-state images/s per logged window.
        rate: Steady-state images over seconds (:func:`steady_rate`; None with ``median``).
        wall_s: Wall time of the run, start-up included.
        error: Why there is no median, or None.
    """

    median: float | None
    rates: tuple[float, ...]
    wall_s: float
    error: str | None = None
    rate: float | None = None


def run_script(
    script: Path, *, steps: int, print_freq: int, warmup_logs: int, timeout: float = 1800.0, extra: tuple[str, ...] = ()
) -> ScriptRun:
    """Run ``script`` (single process, its tuned defaults) for ``steps`` optimizer steps and measure it."""
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as ckpt_dir:
        command = [
            sys.executable, str(script.resolve()), "--max-steps", str(steps), "--print-freq", str(print_freq),
            "--epochs", str(10**6), "--output-dir", ckpt_dir, *extra,  # --max-steps ends it, not the default 10 epochs
        ]
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return ScriptRun(None, (), time.perf_counter() - start, f"train.py did not finish within {timeout:.0f}s")
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return ScriptRun(None, (), wall, f"train.py exited with {proc.returncode}: {tail}")
    rows = parse_log(proc.stdout)
    rates = steady_state(rows, warmup_logs)
    if not rates:
        return ScriptRun(None, (), wall, f"{len(rows)} log lines, none left after {warmup_logs} warm-up lines")
    rate = steady_rate(rows, epoch_ends(proc.stdout), warmup_logs)
    return ScriptRun(float(statistics.median(rates)), tuple(rates), wall, rate=rate)


def steps_for(samples_per_s: float, effective_batch: int, seconds: float, windows: int = 6) -> tuple[int, int]:
    """Optimizer steps and print frequency for about ``seconds`` of steady state in ``windows`` logged windows.

    Two more windows are run and dropped as warm-up.
    """
    steps_per_s = max(samples_per_s, 1e-6) / effective_batch
    freq = max(1, round(steps_per_s * seconds / windows))
    return freq * (windows + 2), freq


def search_output(out_dir: Path) -> tuple[Any, Path] | None:
    """A search's ``best.json`` (read) and its ``train.py``; None after one ``error:`` line when either is missing."""
    from autotune.errors import AutotuneError
    from autotune.output.best import read_best

    try:
        best = read_best(out_dir)
    except AutotuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    script = out_dir / "train.py"
    if not script.is_file():
        print(f"error: {script} does not exist (run `autotune emit {out_dir}`)", file=sys.stderr)
        return None
    return best, script


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="a search output directory (best.json + train.py)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps to run")
    parser.add_argument("--print-freq", type=int, default=5, help="steps per measured window")
    parser.add_argument("--warmup-logs", type=int, default=2, help="log lines to drop as warm-up")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is killed")
    args = parser.parse_args(argv)

    found = search_output(args.out_dir)
    if found is None:
        return 1
    best, script = found

    print(f"$ {script} --max-steps {args.steps} --print-freq {args.print_freq}", flush=True)
    run = run_script(script, steps=args.steps, print_freq=args.print_freq, warmup_logs=args.warmup_logs, timeout=args.timeout)
    if run.median is None:
        print(f"error: {run.error}; raise --steps or lower --print-freq if too few lines", file=sys.stderr)
        return 1
    rates, wall, rate = list(run.rates), run.wall_s, run.rate or run.median
    unit = "samples/s" if best.workload.task is not None else "images/s"  # a Task has no image size either
    print(f"setup:     {best.setup.describe()} ({best.workload.describe(best.world_size)})")
    print(f"train.py:  {rate:.1f} {unit} over {len(rates)} windows (median {run.median:.1f}, "
          f"min {min(rates):.1f}, max {max(rates):.1f}; {wall:.1f}s wall)")
    print(f"search:    {best.samples_per_s:.1f} samples/s (spread {best.samples_per_s_spread:.1f})")
    if best.samples_per_s > 0:
        print(f"ratio:     {rate / best.samples_per_s:.3f}")
    else:
        print("ratio:     n/a (best.json records no throughput)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
