"""Adopt a tuned setup in your own training loop.

    python examples/own_loop.py                        # a setup built inline
    python examples/own_loop.py autotune-out/best.json # the setup a search found

``autotune.load_best`` reads ``best.json``: the winning TrainSetup, whose
helpers apply every knob, and the learning rate scaled for its batch (``lr_for(n)``: for n processes).
The helpers apply the DataLoader arguments, the torch settings
(threads, cuDNN autotuning, TF32), torch.compile, the optimizer's kernels,
channels_last, autocast, the GradScaler (fp16 only) and the accumulation steps. The model and data here
are tiny stand-ins (resnet18 on random 32x32 images, three optimizer steps).
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torchvision
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import autotune
import probes

STEPS = 3


def main(argv: list[str]) -> int:
    # best.json holds the search's --lr scaled to the tuned effective batch; inline, this example's recipe (1e-3 at 256).
    if len(argv) > 1:
        try:
            best = autotune.load_best(argv[1])
        except autotune.AutotuneError as exc:  # no best.json there, or a damaged one: one line
            print(f"error: {exc}", file=sys.stderr)
            return 2
        # best.lr is the rate for the search's processes (best.world_size, DDP ranks); this loop is one process, whose
        # effective batch is 1/world_size of theirs: lr_for() scales the rate to it by the same rule.
        setup, lr, reference = best.setup, best.lr_for(1), best.reference_batch
        if best.world_size != 1:
            print(f"note: tuned with {best.world_size} processes (lr {best.lr:g}); one process here trains an effective batch of "
                  f"{setup.effective_batch()} at lr {lr:g}")
    else:
        setup = autotune.TrainSetup(batch_size=16, accumulation_steps=2, amp="bf16", channels_last=True)
        reference = 256
        lr = 1e-3 * math.sqrt(setup.effective_batch() / reference)  # the square-root rule for AdamW, as the search scales it
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # the probe's bf16 answer: on a CPU that runs it natively, the advice for a GPU's fp16 setup names bf16
        setup.check_device(device, bf16_supported=probes.collect_cpu().bf16 if device == "cpu" else None)
    except autotune.AutotuneError as exc:
        print(f"error: this setup cannot run on {device}: {exc}", file=sys.stderr)
        return 2
    print(f"setup: {setup.describe()} on {device}")

    # Stand-ins for your dataset and model: enough samples for STEPS optimizer steps.
    n = setup.effective_batch() * STEPS
    dataset = TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))
    model = torchvision.models.resnet18(num_classes=10)

    # --- adopting the setup: these lines are all it takes -------------------
    setup.configure_torch(device)  # num_threads, cudnn_benchmark, tf32: before the model runs
    loader = setup.dataloader(dataset, shuffle=True, drop_last=True)
    model = setup.prepare_model(model.to(device))
    scaler = setup.grad_scaler(device)  # None unless amp is fp16
    optimizer = setup.optimizer(model.parameters(), lr=lr)  # AdamW with the tuned kernels (optimizer_impl)
    model = setup.compile_model(model)  # torch.compile when the setup compiles; the model itself otherwise
    # Where the effective batch grew more than 4x over the recipe's (the reference), train.py warms the rate up
    # linearly over the first epoch (at most a tenth of a longer run): here over this one-epoch loop, with LinearLR.
    warmup_steps = len(loader) // setup.accumulation_steps if setup.effective_batch() > 4 * reference else 0
    warmup = (torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup_steps, total_iters=warmup_steps - 1)
              if warmup_steps > 1 else None)
    model.train()
    start = time.perf_counter()
    for i, (images, labels) in enumerate(loader):
        images, labels = setup.to_device((images, labels), device)  # non-blocking from pinned memory; channels_last
        with setup.autocast(device):
            loss = F.cross_entropy(model(images), labels) / setup.accumulation_steps
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if (i + 1) % setup.accumulation_steps == 0:  # one optimizer step per accumulation group
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step = (i + 1) // setup.accumulation_steps
            print(f"step {step} loss {loss.item() * setup.accumulation_steps:.4f} lr {optimizer.param_groups[0]['lr']:.4g}")
            if warmup is not None:
                warmup.step()
    # -------------------------------------------------------------------------
    print(f"done: {len(loader)} micro-batches in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
