"""How long train.py's checkpoint write takes: what a checkpoint inside an epoch costs every --checkpoint-every seconds.

Usage: ``python -m benchmarks.checkpoint_write [--model resnet50] [--repeats 3] [--dir DIR]``

Builds the torchvision model, takes one SGD-with-momentum step (so the
optimizer holds its momentum buffers, as in training), then writes both state
dicts as train.py does (``torch.save`` to a temporary file, ``flush``,
``fsync``, ``os.replace``) ``--repeats`` times into ``--dir`` (default: the
temporary directory), printing each write's seconds and the file's size.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: the temporary directory)")
    args = parser.parse_args()

    import torch
    import torchvision

    model = torchvision.models.get_model(args.model, weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    optimizer.step()
    with tempfile.TemporaryDirectory(dir=args.dir) as where:
        path = os.path.join(where, "checkpoint.pth")
        for _ in range(args.repeats):
            began = time.perf_counter()
            with open(path + ".tmp", "wb") as file:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(path + ".tmp", path)
            print(f"{args.model}: {time.perf_counter() - began:.2f} s, {os.path.getsize(path) / 2**20:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
