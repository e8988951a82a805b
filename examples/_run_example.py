"""Shared by the workload examples: tune one tiny workload, then run the emitted train.py.

``run_example("text_classifier:make_task")`` is the Python equivalent of::

    cd examples && autotune search --workload text_classifier:make_task --trials 3 --trial-seconds 1 \
        --device cpu --confirm-top 1 --confirm-rounds 1 --out WORK_DIR/out

followed by ``python WORK_DIR/out/train.py --max-steps 2``. The examples run it as ``python examples/NAME.py [WORK_DIR]``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import autotune


def run_example(workload: str, work_dir: str | None = None, trials: int = 3) -> int:
    """Search ``workload`` (tiny: 1-s trials, one confirmation round) and run its train.py for two steps."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="autotune-example-"))
    try:
        result = autotune.search(
            workload=workload,
            trials=trials,
            device="cpu",
            trial_seconds=1.0,
            confirm_top=1,
            confirm_rounds=1,
            out=work / "out",
            progress=True,
        )
    except autotune.AutotuneError as exc:  # a refusal: its one line, as the CLI says it, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: what was measured is kept in WORK_DIR/out
        print(f"error: {exc or 'interrupted'}", file=sys.stderr)
        return 130
    assert result.setup is not None
    # speedup is None where nothing was compared with the defaults (they won alone, failed or never ran): the notes say which.
    speedup = f"{result.speedup:.2f}x the defaults" if result.speedup is not None else "no speedup: see the notes above"
    print(f"winner: {result.setup.describe()} at {result.samples_per_s:.1f} samples/s ({speedup})")
    print(f"wrote {result.best_json} and {result.train_py}")
    command = [sys.executable, str(result.train_py), "--max-steps", "2", "--print-freq", "1", "--output-dir", str(work / "train-out")]
    print(f"$ {shlex.join(command)}", flush=True)
    return subprocess.run(command).returncode
