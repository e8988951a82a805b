"""Whether an iterable dataset splits its stream among loader workers.

A map-style dataset is split by the loader's sampler; an ``IterableDataset``
must split itself, in ``__iter__``, with ``torch.utils.data.get_worker_info()``.
One that does not yields its whole stream from every worker: with two
workers every item arrives twice, and a trial would count the copies as
speed. :func:`workers_repeat_items` asks two real workers for their first
items and compares them, with every worker's random generators seeded alike
so that random augmentation cannot hide the copies.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

#: Why such a dataset gets one loader worker at most (the search's log line and its refusals).
UNSHARDED = (
    "this IterableDataset does not split its stream among loader workers (get_worker_info()), "
    "so every worker would yield every item"
)
#: Items compared per worker.
PROBE_ITEMS = 2
#: Seconds a worker may take for one item before the check gives up (and assumes nothing).
PROBE_TIMEOUT_S = 120.0


#: The seed every probing worker starts from (see :func:`_same_seed`).
PROBE_SEED = 0


def _as_is(item: Any) -> Any:
    return item


def _same_seed(worker_id: int) -> None:
    """Seed a probing worker's generators (torch, ``random``, NumPy) alike in every worker.

    The loader seeds each worker differently, so a stream that augments
    randomly before it yields (noise, a random crop) would hand two workers
    different copies of the same item. Seeded alike, a stream that ignores
    :func:`torch.utils.data.get_worker_info` yields equal items from both;
    one that splits itself still yields different items.
    """
    import random

    import numpy
    import torch

    torch.manual_seed(PROBE_SEED)
    random.seed(PROBE_SEED)
    numpy.random.seed(PROBE_SEED)


def same_item(a: Any, b: Any) -> bool:
    """Whether two dataset items are equal: tensors and arrays element-wise, containers item by item."""
    import numpy
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
        )
    if isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray):
        return bool(numpy.array_equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_item(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_item(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value
        return False


def workers_repeat_items(dataset: Any) -> bool:
    """Whether two loader workers yield the same first items of ``dataset`` (an ``IterableDataset``).

    The loader takes its items from the workers in turn (worker 0, worker 1,
    worker 0, ...), so the stream's pairs hold one item of each. Every pair
    equal means each worker yields the whole stream. The workers' generators
    are seeded alike (:func:`_same_seed`). A loader that fails or
    stalls here says nothing (False): calibration measures workers anyway.
    """
    from torch.utils.data import DataLoader

    try:
        loader = DataLoader(
            dataset, batch_size=None, num_workers=2, collate_fn=_as_is, timeout=PROBE_TIMEOUT_S, worker_init_fn=_same_seed
        )
        stream = iter(loader)
        items = list(itertools.islice(stream, 2 * PROBE_ITEMS))
        del stream  # stops the workers
    except Exception:
        return False
    pairs = [(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
    return bool(pairs) and all(same_item(a, b) for a, b in pairs)
