"""How often a torchrun job of the emitted Task script fails after it trained to its end.

Usage: ``python -m benchmarks.torchrun_exit [--runs 40] [--load 2] [--out DIR]``

The script as emitted (each process ends through ``leave()``: atexit's handlers, then ``os._exit`` without the
interpreter's teardown) and the same script ending with ``sys.exit`` as before, run alternately, each as
``torchrun --standalone --nproc_per_node=2 train.py --epochs 2`` of a linear model under DDP on the CPU (gloo). A run
counts as an abort when it exits non-zero with ``terminate called without an active exception`` on its error output;
each such run's output is kept in ``--out``. ``--load N`` keeps N busy Python processes running beside the runs, since
the abort showed on a loaded machine (DDP keeps its gloo group's worker threads alive past ``destroy_process_group``,
and one releasing a finished collective during the teardown aborts the process).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ABORT = "terminate called without an active exception"
BUSY = "while True: pass"


def task() -> object:
    """The workload: a linear model on 96 random samples in 3 classes, batch 4."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    import autotune

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 8, generator=generator), torch.randint(0, 3, (96,), generator=generator))
    return autotune.Task(nn.Linear(8, 3), data, loss=nn.CrossEntropyLoss(), batch_size=4)


def write_scripts(folder: Path) -> dict[str, Path]:
    """The emitted script (``leave``) and its copy that ends with ``sys.exit`` (``sys.exit``), each in its own folder."""
    from autotune.output.best import Best
    from autotune.output.emit import write_script
    from autotune.train_setup import TrainSetup
    from autotune.workloads.tasks import build_task_workload

    work = build_task_workload("benchmarks.torchrun_exit:task", device="cpu")
    setup = TrainSetup(batch_size=4)
    best = Best(setup=setup, workload=work, samples_per_s=100.0, samples_per_s_spread=1.0, defaults_samples_per_s=None,
                speedup=None, peak_memory_bytes=None, effective_batch=setup.effective_batch(),
                reference_batch=work.reference_batch or 32, lr=work.lr)
    emitted = write_script(best, folder / "leave" / "train.py")
    text = emitted.read_text()
    ending = "    leave(code)  # out of the handler"
    if text.count(ending) != 1:
        raise SystemExit("error: the emitted script's last line is not leave(code): this comparison is out of date")
    plain = folder / "sys.exit" / "train.py"
    plain.parent.mkdir(parents=True)
    plain.write_text(text.replace(ending, "    sys.exit(code)  # out of the handler"))
    return {"leave": emitted, "sys.exit": plain}


def run_once(script: Path, out: Path, name: str) -> str:
    """One torchrun job: ``ok``, ``abort`` (its output kept in ``out/name.*``) or ``failed`` (kept too)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
                          "--epochs", "2", "--workers", "0", "--output-dir", str(script.parent / "out")],
                         cwd=script.parent, capture_output=True, text=True, env=env, timeout=300)
    if ran.returncode == 0:
        return "ok"
    (out / f"{name}.stdout").write_text(ran.stdout)
    (out / f"{name}.stderr").write_text(ran.stderr)
    return "abort" if ABORT in ran.stderr else "failed"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="jobs of each script (default: %(default)s)")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="where the failed runs' output goes (default: a temporary folder)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="torchrun-exit-"))
    out.mkdir(parents=True, exist_ok=True)
    scripts = write_scripts(Path(tempfile.mkdtemp(prefix="torchrun-exit-scripts-")))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.load)]
    counts: dict[str, dict[str, int]] = {way: {"ok": 0, "abort": 0, "failed": 0} for way in scripts}
    try:
        for index in range(args.runs):
            for way, script in scripts.items():  # alternately, so both meet the same load
                counts[way][run_once(script, out, f"{way}-{index}")] += 1
            print(f"run {index + 1}: " + "; ".join(f"{way} {c['ok']} ok, {c['abort']} aborted, {c['failed']} failed otherwise"
                                                   for way, c in counts.items()), flush=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    print(f"the failed runs' output: {out}")


if __name__ == "__main__":
    main()
