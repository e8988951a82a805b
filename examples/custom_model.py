"""Emit a train.py for your own model, given as a ``module:function`` factory.

    python examples/custom_model.py [WORK_DIR]

A model factory is any importable function that returns an ``nn.Module``;
autotune calls it with ``num_classes=`` when it takes that argument. This
example uses ``tiny_net:tiny_net`` (``examples/tiny_net.py``).

No search runs here: the example writes a hand-made ``best.json`` (nothing in
it was measured), renders ``train.py`` from it with ``write_script``, and runs
that script for two optimizer steps. The emitted script imports the factory
from its working directory, so ``tiny_net.py`` is copied next to it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.best import Best, write_best
from autotune.config import TrainSetup
from autotune.data import ensure_synthetic
from autotune.emit import write_script
from autotune.workload import Workload

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    work = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="autotune-custom-model-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "tiny_net.py", work / "tiny_net.py")
    cache = work / "cache"
    ensure_synthetic(cache, n_images=64)  # 64 small JPEGs in ImageFolder layout

    workload = Workload(
        model="tiny_net:tiny_net",
        image_size=32,
        device="cpu",
        num_classes=10,
        lr=1e-3,
        synthetic_images=64,
        cache_dir=str(cache),
    )
    setup = TrainSetup(num_workers=1, prefetch_factor=2, batch_size=16, accumulation_steps=2)
    best = Best(
        setup=setup,
        workload=workload,
        samples_per_s=0.0,
        samples_per_s_spread=0.0,
        defaults_samples_per_s=None,
        speedup=None,
        peak_memory_bytes=None,
        effective_batch=setup.effective_batch(),
        reference_batch=32,
        lr=workload.lr * setup.effective_batch() / 32,
        command="python examples/custom_model.py",
        notes=("hand-written example: nothing was measured",),
    )
    write_best(work / "best.json", best)
    script = write_script(best, work / "train.py")
    print(f"wrote {work / 'best.json'} and {script}")

    command = [sys.executable, "train.py", "--max-steps", "2", "--print-freq", "1", "--output-dir", "train-out"]
    print(f"$ cd {shlex.quote(str(work))} && {shlex.join(command)}", flush=True)
    return subprocess.run(command, cwd=work).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
