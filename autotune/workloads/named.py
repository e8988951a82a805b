"""The data of the emitted Task script (``train.py``), whose failure names itself in one line, as in the search.

Without it, a dataset item that raises (``dataset[250]``: a corrupt record), a stream that raises, or a batch that
cannot be collated (items of different shapes) ended hours of training with the DataLoader's traceback, 40 lines
through the script's own frames, while the search said the same fault in one line. :func:`named_data` wraps the
dataset and the collate function the script hands its DataLoader; :func:`error_line` is the line the script exits
with for any of autotune's errors, also for one a loader worker raised (the DataLoader raises it again in the main process, the worker's
traceback in its message).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from autotune.errors import USER_CODE_ERRORS, AutotuneError, WorkloadError
from autotune.workloads.batches import describe_batch, hinted
from autotune.workloads.collation import bad_item, batched_read, collate_items
from autotune.workloads.data import BadData

__all__ = ["BadBatch", "error_line", "named_data"]

#: What the script adds to a :class:`BadData` line.
BAD_DATA_HINT = "fix or replace it, then rerun (--resume goes on from the last checkpoint)"


def named_data(dataset: Any, collate: Callable[[list[Any]], Any]) -> tuple[Any, Callable[[Any], Any]]:
    """``dataset`` and ``collate`` (a Task's :meth:`~autotune.Task.collate`) as the script's DataLoader takes them:
    an item, a batched read (``__getitems__``) or an iterable's stream that fails is :class:`BadData` naming it; a
    batch that cannot be collated is a :class:`WorkloadError` naming the item at fault and the fix. What the loader
    yields is unchanged."""
    if isinstance(dataset, IterableDataset):
        named: Any = _NamedStream(dataset)
    elif batched_read(dataset) is not None:
        named = _NamedBatches(dataset)
    else:
        named = _NamedItems(dataset)
    return named, _NamedCollate(collate)


class BadBatch(WorkloadError):
    """A batch of the loader cannot be collated (a collate_fn is needed, or the one given fails on this batch)."""


def error_line(exc: AutotuneError) -> str:
    """The line the script exits with for ``exc`` (from :func:`named_data`'s data, or a Task's own refusal): its
    message, or, raised again by the DataLoader for a loader worker, the last line of the worker's traceback it quotes.
    Under torchrun (``WORLD_SIZE`` over 1) the data's fault names the rank that met it: ``error: rank 1: bad data: ...``."""
    text = str(exc).strip()
    if text.startswith("Caught ") and "\n" in text:
        cls = type(exc)
        text = text.splitlines()[-1].removeprefix(f"{cls.__module__}.{cls.__qualname__}: ")
    if not isinstance(exc, (BadData, BadBatch)):
        return f"error: {text}"
    said = f"bad data: {text}; {BAD_DATA_HINT}" if isinstance(exc, BadData) else text
    return f"error: rank {os.environ.get('RANK', '?')}: {said}" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else f"error: {said}"


class _NamedItems(Dataset):
    """A map-style dataset whose item that raises is :class:`BadData` ``dataset[i] failed: ...``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except USER_CODE_ERRORS as exc:
            raise bad_item(exc, f"dataset[{index}]") from None


class _NamedBatches(_NamedItems):
    """A map-style dataset with its own batched read, which the DataLoader calls instead of ``__getitem__``."""

    def __getitems__(self, indices: list[int]) -> Any:
        try:
            return self.dataset.__getitems__(indices)
        except USER_CODE_ERRORS as exc:
            span = f"[{indices[0]}]" if len(indices) == 1 else f"[{indices[0]}..{indices[-1]}]"
            raise bad_item(exc, f"dataset.__getitems__({span})") from None


class _NamedStream(IterableDataset):
    """An iterable dataset whose stream that raises is :class:`BadData` naming the dataset's type.

    Its ``__iter__`` runs in each loader worker, where the dataset's own sharding (``get_worker_info()``) sees the
    worker as before."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        what = f"iterating the dataset ({type(self.dataset).__name__})"
        try:
            stream = iter(self.dataset)
        except USER_CODE_ERRORS as exc:
            raise bad_item(exc, what) from None
        while True:
            try:
                item = next(stream)
            except StopIteration:
                return
            except USER_CODE_ERRORS as exc:
                raise bad_item(exc, what) from None
            yield item


class _NamedCollate:
    """The collate function: a batch that cannot be collated names the item at fault, and the fix."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, batch: Any) -> Any:
        try:
            if isinstance(batch, list):  # items (from __getitem__, a stream, or a batched read that returns them)
                return collate_items(self.collate, batch, label="batch item")
            return self.collate(batch)
        except WorkloadError as exc:
            raise BadBatch(str(exc)) from None
        except USER_CODE_ERRORS as exc:
            raise BadBatch(hinted(f"what the dataset's __getitems__ returned ({describe_batch(batch)}) cannot be "
                                       f"collated: {type(exc).__name__}: {exc}")) from None
