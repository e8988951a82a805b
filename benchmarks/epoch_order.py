"""Memory and time of an epoch's order in the emitted train.py, against the DistributedSampler's list.

Usage: ``python -m benchmarks.epoch_order [--items 50000000]``

Each way runs in a fresh interpreter (``--way list`` or ``--way tensor``): the RSS it grew and the seconds until the
first index of epoch 0. ``list`` is ``torch.utils.data.DistributedSampler``'s own iteration (a Python list of every
index); ``tensor`` is the emitted script's ``ResumableSampler`` (the same order, kept as an int64 tensor, read in chunks).
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import time
from collections.abc import Sequence


def _measure(way: str, items: int) -> None:
    import psutil
    import torch
    from torch.utils.data import DistributedSampler

    class Sized:
        def __len__(self) -> int:
            return items

    process = psutil.Process()
    before, began = process.memory_info().rss, time.perf_counter()
    if way == "list":
        sampler = DistributedSampler(Sized(), num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)  # type: ignore[arg-type]
        order = iter(sampler)
    else:
        generator = torch.Generator()
        generator.manual_seed(0)
        mine = torch.randperm(items, generator=generator)
        order = (index for chunk in mine.split(65536) for index in chunk.tolist())
    list(itertools.islice(order, 10))
    grew = (process.memory_info().rss - before) / 2**20
    print(f"{way:6s} {items} items: RSS grew {grew:.0f} MiB, first index after {time.perf_counter() - began:.2f} s", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both ways, each in its own interpreter; return the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--items", type=int, default=50_000_000)
    parser.add_argument("--way", choices=("list", "tensor"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.way is not None:
        _measure(args.way, args.items)
        return 0
    for way in ("list", "tensor"):
        subprocess.run([sys.executable, "-m", "benchmarks.epoch_order", "--way", way, "--items", str(args.items)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
