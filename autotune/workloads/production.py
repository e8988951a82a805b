"""How fast the DataLoader's workers can make batches, read from inside the workers.

A trial's windows count the batches the training consumed. Over a short
window that can exceed what the loader sustains: workers that started
together deliver their batches in waves, each wave arriving at the pace the
training consumed the last one, with a wait before the next. A window
inside a wave measures the training's own pace; the loader's, over a whole
cycle, is lower. On a GPU this is the rule, not the exception: 16 workers
each take seconds for one batch of 1,024 JPEGs, longer than a window.

So each worker times its own batches (from the first item read to the
collated batch) in shared memory, and :meth:`ProductionClock.batches_per_s`
turns their mean time per batch into batches a second: no pipeline
sustains more than its workers make.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any


class ProductionClock:
    """Each loader worker's batches and mean time per batch, in memory the workers share.

    Built before the DataLoader, in the trial process; the wrapped dataset
    and collate function (:meth:`wrap`) write, the trial process reads. A
    worker keeps its own counts and publishes its mean seconds per batch,
    then how many batches after its first that mean covers; a reader
    between the two weighs that worker a batch off, or takes its first
    steady mean for a first batch, never its cold first for a steady one.
    """

    def __init__(self, workers: int) -> None:
        from multiprocessing.sharedctypes import RawArray, RawValue

        self.workers = workers
        self._mean = RawArray("d", workers)  # mean seconds per batch of each worker, 0 until its first batch
        self._after = RawArray("d", workers)  # batches after its first that the mean covers (0: the first's seconds)
        self._paused = RawValue("d", -1.0)  # when the trial last paused (a held trial between rounds, :meth:`pause`)
        self._resumed = RawValue("d", -1.0)  # and when it went on (:meth:`resume`)
        self._own: dict[int, list[float]] = {}  # in each worker: batches made, seconds making them, its first's seconds

    def wrap(self, dataset: Any, collate_fn: Callable[[list[Any]], Any] | None) -> tuple[TimedItems, TimedCollate]:
        """The map-style ``dataset`` and its ``collate_fn`` (``None``: PyTorch's default), timed per batch in the workers."""
        from torch.utils.data import default_collate

        items = TimedItems(dataset)
        return items, TimedCollate(collate_fn or default_collate, self, items)

    def pause(self) -> None:
        """Note that the trial's process group stops now (a held trial between its rounds): a batch a worker was making
        then would count the whole pause as its own time, and is left out (:meth:`record`)."""
        self._paused.value = time.perf_counter()
        self._resumed.value = math.inf  # until :meth:`resume`: a batch begun after this note and before the stop

    def resume(self) -> None:
        """Note that the trial's process group goes on (after :meth:`pause`)."""
        self._resumed.value = time.perf_counter()

    def record(self, worker: int, seconds: float, started: float | None = None) -> None:
        """Count one batch that worker ``worker`` made in ``seconds`` from ``started`` (called in that worker) and
        publish its mean.

        The mean leaves out the worker's first batch once it made another, as a trial's warm-up leaves out the
        first steps (the first batch meets cold caches and lazy initialisation in the dataset), and a batch made
        across a pause (:meth:`pause`).
        """
        if started is not None and started < self._resumed.value and started + seconds > self._paused.value:
            return  # made across the pause: from before its end to after its start
        own = self._own.setdefault(worker, [0.0, 0.0, seconds])
        own[0] += 1
        own[1] += seconds
        made, total, first = own
        mean = (total - first) / (made - 1) if made >= 2 else total
        if mean > 0:  # the mean first: read between the two, a new steady mean still counts as a first batch
            self._mean[worker] = mean
            self._after[worker] = made - 1

    def batches_per_s(self) -> float | None:
        """Batches a second all workers together make when each is busy: the workers over their mean time per batch.

        The mean pools every worker's batches after its first (a worker that made only its first counts only while
        none made more), not a sum of the workers' rates: a worker whose one batch after its first held only cheap
        items would count as if all its batches were that quick. ``None`` before any worker made a batch.
        """
        pairs = [(after, mean) for after, mean in zip(self._after[:], self._mean[:], strict=True) if mean > 0]
        if not pairs:
            return None
        steady = [(after, mean) for after, mean in pairs if after >= 1]
        if steady:
            mean = sum(after * mean for after, mean in steady) / sum(after for after, _ in steady)
        else:
            mean = sum(mean for _, mean in pairs) / len(pairs)
        return self.workers / mean


class TimedItems:
    """A map-style dataset read a batch at a time (``__getitems__``), noting when a worker starts a batch."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.started = 0.0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        self.started = time.perf_counter()
        items = getattr(self.dataset, "__getitems__", None)  # the dataset's own batched read returns what it returns
        return items(indices) if items is not None else [self.dataset[i] for i in indices]


class TimedCollate:
    """A collate function that counts each batch a worker made, from its first item to its collated batch."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any], clock: ProductionClock, items: TimedItems) -> None:
        self.collate_fn = collate_fn
        self.clock = clock
        self.items = items  # the dataset the same worker reads: it noted when the batch began

    def __call__(self, items: list[Any]) -> Any:
        from torch.utils.data import get_worker_info

        batch = self.collate_fn(items)
        info = get_worker_info()
        if info is not None and self.items.started:
            self.clock.record(info.id, time.perf_counter() - self.items.started, self.items.started)
        return batch
