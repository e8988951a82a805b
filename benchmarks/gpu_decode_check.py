"""Where a ``decode=gpu`` loader stops: run on a GPU machine, one variant per process.

    python -m benchmarks.gpu_decode_check VARIANT    # VARIANT: no-workers, workers, workers-torchvision-read

Each variant opens the classifier's ``decode=gpu`` pipeline on 64 synthetic
JPEGs, starts CUDA (a model step), then reads 4 batches of 32 through the
DataLoader and decodes them on the GPU, printing each stage with its time.
``workers-torchvision-read`` reads the files with ``torchvision.io.read_file``
in the workers, as the trials did before 6714e0f (it never returned there,
docs/benchmarks.md, "The first GPU run"). A variant still running after 18 s
prints every thread's stack and exits 1.
"""

from __future__ import annotations

import faulthandler
import sys
import time
from typing import Any

VARIANTS = ("no-workers", "workers", "workers-torchvision-read")


def main(variant: str) -> int:
    """Run one variant; 0 when its 4 batches were decoded."""
    if variant not in VARIANTS:
        print(f"gpu_decode_check: unknown variant {variant!r}; one of {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    faulthandler.dump_traceback_later(18, exit=True)
    import torch

    import autotune.workloads.gpu_decode as gpu_decode
    from autotune.records import Workload
    from autotune.train_setup import TrainSetup
    from autotune.workloads.pipeline import endless_batches, open_pipeline

    started = time.perf_counter()

    def say(*words: Any) -> None:
        print(f"[{variant} {time.perf_counter() - started:5.1f} s]", *words, flush=True)

    if variant == "workers-torchvision-read":
        from torchvision.io import read_file

        gpu_decode.read_bytes = read_file  # type: ignore[assignment]
    workload = Workload(model="resnet18", image_size=64, device="cuda:0", num_classes=10, synthetic_images=64)
    pipeline = open_pipeline(workload, decode="gpu")
    dataset = pipeline.dataset()
    model = pipeline.model().cuda()
    model(torch.randn(32, 3, 64, 64, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    say("CUDA started (one model step)")
    workers = 0 if variant == "no-workers" else 2
    setup = TrainSetup(batch_size=32, num_workers=workers, prefetch_factor=2 if workers else None, pin_memory=True, decode="gpu")
    batches = endless_batches(setup, dataset, collate_fn=pipeline.collate_fn(), seed=0)
    decoder = gpu_decode.GpuDecoder(64, "cuda:0")
    for index in range(4):
        batch = next(batches)
        say(f"batch {index}: {len(batch[0])} files")
        images, _ = decoder(batch)
        torch.cuda.synchronize()
        say(f"decoded {tuple(images.shape)}")
    say("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
