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
#: Items compared per worker. A stream that generates its items at random, seeded apart, must not pass for a copy by
#: chance: its discrete parts (a label of two classes) agree in all of them with a probability of 2**-16.
PROBE_ITEMS = 16
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


def _discrete(item: Any) -> list[Any]:
    """The parts of an item random augmentation leaves alone, in order: integers, booleans, strings, integer tensors."""
    import numpy
    import torch

    if isinstance(item, torch.Tensor):
        return [] if item.is_floating_point() or item.is_complex() else [item.tolist()]
    if isinstance(item, numpy.ndarray):
        return [item.tolist()] if item.dtype.kind in "iub" else []
    if isinstance(item, Mapping):
        return [part for key in item for part in [key, *_discrete(item[key])]]
    if isinstance(item, (list, tuple)):
        return [part for x in item for part in _discrete(x)]
    return [item] if isinstance(item, (int, str, bytes)) else []  # bool is an int


def _pairs(dataset: Any, seeded: bool) -> list[tuple[Any, Any]]:
    """The first items of two real loader workers, one of each per pair (``seeded``: their generators seeded alike)."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=None, num_workers=2, collate_fn=_as_is, timeout=PROBE_TIMEOUT_S,
                        worker_init_fn=_same_seed if seeded else None)
    stream = iter(loader)
    items = list(itertools.islice(stream, 2 * PROBE_ITEMS))
    del stream  # stops the workers
    return [(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]


def workers_repeat_items(dataset: Any) -> bool:
    """Whether two loader workers yield the same first items of ``dataset`` (an ``IterableDataset``).

    The loader takes its items from the workers in turn (worker 0, worker 1,
    worker 0, ...), so the stream's pairs hold one item of each. Every pair
    equal means each worker yields the whole stream. A stream that augments
    randomly yields equal pairs only when the workers' generators are seeded
    alike (:func:`_same_seed`); it is told from a stream that generates its
    items at random (whose workers yield different items in training, as
    they are seeded apart) by the parts augmentation leaves alone: labels,
    token ids, strings agree between the workers, seeded apart as in
    training. A stream with no such part is not taken for a copy then. A
    loader that fails or stalls here says nothing (False): calibration
    measures workers anyway.
    """
    try:
        pairs = _pairs(dataset, seeded=False)
        if pairs and all(same_item(a, b) for a, b in pairs):
            return True
        if not pairs or not all(_discrete(a) and _discrete(a) == _discrete(b) for a, b in pairs):
            return False
        seeded = _pairs(dataset, seeded=True)
    except Exception:
        return False
    return bool(seeded) and all(same_item(a, b) for a, b in seeded)
