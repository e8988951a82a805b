"""Search and emit a train.py for your own model, given as ``module:function``.

    python examples/custom_model.py [WORK_DIR]

A model factory is any importable function that returns an ``nn.Module``;
autotune calls it with ``num_classes=`` when it takes that argument. This
example uses ``tiny_net:tiny_net`` (``examples/tiny_net.py``), copied into
the working directory, which is where autotune (and the emitted script) look
for it. It runs a real, tiny search (3 one-second trials on 64 synthetic
JPEGs; the batch is capped so that one optimizer step fits in them; the
winner's bottleneck verdict uses the calibration's ceilings), the Python
equivalent of::

    cd WORK_DIR && autotune search --model tiny_net:tiny_net --image-size 32 --trials 3 \
        --trial-seconds 1 --device cpu --synthetic-images 64 --cache-dir cache \
        --confirm-top 1 --confirm-rounds 1 --no-ceilings --out out

then runs the emitted ``out/train.py`` for two optimizer steps.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune import AutotuneError, SearchConfig, run_search
from autotune.render import RichReporter, console

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    # Absolute: the working directory changes below (a relative one wrote to relwork/relwork/ and printed paths that were not there).
    work = Path(argv[1]).resolve() if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="autotune-custom-model-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "tiny_net.py", work / "tiny_net.py")
    os.chdir(work)  # the factory is imported from the working directory
    config = SearchConfig(
        model="tiny_net:tiny_net",
        trials=3,
        image_size=32,
        device="cpu",
        trial_seconds=1.0,
        out=work / "out",
        cache_dir=work / "cache",
        synthetic_images=64,
        confirm_top=1,
        confirm_rounds=1,
        ceilings=False,  # a demo: skip the two runs that re-measure the ceilings at the winner's setup
        command="python examples/custom_model.py",
    )
    try:
        with RichReporter(console(stderr=True)) as reporter:  # the calibration's runs and each trial as they end, as the CLI prints them
            outcome = run_search(config, reporter)
    except AutotuneError as exc:  # a refusal: its one line, as the CLI says it, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: what was measured is kept in WORK_DIR/out
        print(f"error: {exc or 'interrupted'}", file=sys.stderr)
        return 130
    assert outcome.best is not None
    print(f"winner: {outcome.best.setup.describe()} at {outcome.best.samples_per_s:.1f} samples/s")
    print("wrote " + ", ".join(outcome.files))

    command = [sys.executable, "out/train.py", "--max-steps", "2", "--print-freq", "1", "--output-dir", "train-out"]
    print(f"$ cd {shlex.quote(str(work))} && {shlex.join(command)}", flush=True)
    return subprocess.run(command, cwd=work).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
