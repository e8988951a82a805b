"""The data of the emitted Task script (``train.py``), whose failure names itself in one line.

Without it, a dataset item that raises (``dataset[250]``: a corrupt record, or a case the dataset's own code gets
wrong) or a batch that cannot be collated (items of different shapes) ended hours of training with the DataLoader's
traceback, 40 lines through the script's own frames. :func:`named_data` wraps a map-style dataset and the collate
function the script hands its DataLoader; :func:`error_line` is the line the script exits with, after it wrote the
whole traceback (a loader worker's too) to a file it names. An iterable dataset's stream that raises is named by how far
its pass got (it has no index); a DataPipe is handed over as it is: the DataLoader shards one only when it sees it.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset, MapDataPipe, default_collate, get_worker_info
from torch.utils.data.datapipes.datapipe import IterDataPipe

from autotune.errors import USER_CODE_ERRORS, AutotuneError, WorkloadError, is_out_of_memory, is_shm_full
from autotune.workloads.batches import RAGGED_HINT, describe_batch, hinted
from autotune.workloads.collation import ItemsWrapper, batched_read, collate_items, failing_item, same_shapes

__all__ = ["BadBatch", "BadItem", "error_line", "named_data"]

#: What the script adds to the line of an item that failed.
BAD_ITEM_HINT = "fix the item or the dataset's code, then rerun (--resume goes on from the last checkpoint)"


class BadItem(WorkloadError):
    """A dataset item, or a batched read, raised: the data, or the dataset's code on it."""


class BadBatch(WorkloadError):
    """A batch cannot be collated (items that differ in shape need a collate_fn that pads them, or the one given fails)."""


def named_data(dataset: Any, collate_fn: Callable[[list[Any]], Any] | None) -> tuple[Any, Callable[[Any], Any]]:
    """``dataset`` and ``collate_fn`` (a Task's; ``None``: PyTorch's default) as the script's DataLoader takes them: an
    item or a batched read (``__getitems__``) of a map-style dataset that raises is :class:`BadItem` naming it; a batch
    that cannot be collated is :class:`BadBatch` naming the item at fault (and, for PyTorch's default collate on items
    of different shapes, the fix); an iterable dataset's stream that raises is :class:`BadItem` naming the item of
    its pass it failed on (a DataPipe is kept as it is). What the loader yields is unchanged; each wrapper pickles as
    what it holds, for workers started by spawn or forkserver."""
    collate = _NamedCollate(collate_fn)
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):
        return dataset, collate
    if isinstance(dataset, IterableDataset):
        return (_NamedSizedStream if hasattr(dataset, "__len__") else _NamedStream)(dataset), collate
    return (_NamedBatches if batched_read(dataset) is not None else _NamedItems)(dataset), collate


def error_line(exc: AutotuneError, output_dir: str | Path | None = None) -> str:
    """The line the script exits with for ``exc`` (from :func:`named_data`'s data, or a Task's own refusal).

    Its message, or, raised again by the DataLoader for a loader worker, the last line of the worker's traceback it
    quotes. For the data's fault: the whole traceback is written to ``OUTPUT_DIR/error.log`` (``error-rank1.log`` ...
    under torchrun) and named, and under torchrun the line names the rank that met it (each reads its own share).
    """
    text = str(exc).strip()
    if text.startswith("Caught ") and "\n" in text:
        cls = type(exc)
        text = text.splitlines()[-1].removeprefix(f"{cls.__module__}.{cls.__qualname__}: ")
    if not isinstance(exc, (BadItem, BadBatch)):
        return f"error: {text}"
    said = f"{text}; {BAD_ITEM_HINT}" if isinstance(exc, BadItem) else text
    ranks = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if output_dir is not None:
        log = Path(output_dir) / (f"error-rank{os.environ.get('RANK', '0')}.log" if ranks else "error.log")
        try:
            log.write_text("".join(traceback.format_exception(exc)))
            said += f"; its traceback: {log}"
        except OSError:
            pass
    return f"error: rank {os.environ.get('RANK', '?')}: {said}" if ranks else f"error: {said}"


def _failed(exc: BaseException, where: str) -> str:
    """``where failed (in a loader worker): Type: first line``."""
    first = (str(exc).strip().splitlines() or [""])[0]
    worker = " (in a loader worker)" if get_worker_info() is not None else ""
    return f"{where} failed{worker}: {type(exc).__name__}: {first}"


class _NamedItems(ItemsWrapper):
    """A map-style dataset whose item that raises is :class:`BadItem` ``dataset[i] failed: ...`` (running out of
    memory stays itself)."""

    def failed(self, exc: BaseException, index: int) -> None:
        if not is_out_of_memory(exc) and not is_shm_full(exc):
            raise BadItem(_failed(exc, f"dataset[{index}]")) from exc


class _NamedBatches(_NamedItems):
    """A map-style dataset with its own batched read (a ``Subset`` has one), which the DataLoader calls instead of
    ``__getitem__``: the item at fault is named where it fails when read alone, as the search names it."""

    def __getitems__(self, indices: list[int]) -> Any:
        try:
            return self.dataset.__getitems__(indices)
        except USER_CODE_ERRORS as exc:
            if is_out_of_memory(exc) or is_shm_full(exc):
                raise
            shown = ", ".join(str(i) for i in indices[:8]) + (", ..." if len(indices) > 8 else "")
            where, error = failing_item(self.dataset, indices) or (f"dataset.__getitems__([{shown}])", exc)
            raise BadItem(_failed(error, where)) from error  # the traceback of the error the line names


class _NamedStream(IterableDataset):
    """An iterable dataset (not a DataPipe) whose stream that raises is :class:`BadItem` ``the dataset's stream failed
    at item 76 of this pass: ...`` (in a loader worker: ``in loader worker 1 of 2, at its item 76``, each worker reading
    its own part); running out of memory stays itself. Its ``__iter__`` runs where the wrapped one would, so a stream
    that splits itself by get_worker_info() still does."""

    def __init__(self, dataset: IterableDataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Any:
        count = 0
        try:
            iterator = iter(self.dataset)
            while True:
                try:
                    item = next(iterator)
                except StopIteration:
                    return
                count += 1
                yield item
        except USER_CODE_ERRORS as exc:
            if is_out_of_memory(exc) or is_shm_full(exc):
                raise
            info = get_worker_info()
            where = f"in loader worker {info.id} of {info.num_workers}, at its item" if info is not None else "at item"
            first = (str(exc).strip().splitlines() or [""])[0]
            raise BadItem(f"the dataset's stream failed {where} {count + 1} of this pass: {type(exc).__name__}: {first}") from exc


class _NamedSizedStream(_NamedStream):
    """A :class:`_NamedStream` of a stream with a length (webdataset's with_length()), which the DataLoader reads."""

    def __len__(self) -> int:
        return len(self.dataset)


class _NamedCollate:
    """The collate function: a batch that cannot be collated names the item at fault, and the fix."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any] | None) -> None:
        self.collate = collate_fn if collate_fn is not None else default_collate
        self.default = collate_fn is None

    def __call__(self, batch: Any) -> Any:
        try:
            if isinstance(batch, list):  # items (from __getitem__, a stream, or a batched read that returns them)
                return collate_items(self.collate, batch, label="batch item")
            return self.collate(batch)
        except WorkloadError as exc:  # collate_items's line, naming the item at fault
            if exc.__cause__ is not None and (is_out_of_memory(exc.__cause__) or is_shm_full(exc.__cause__)):
                raise exc.__cause__ from None  # not the items' fault: the script's own line says what ran out
            said = str(exc)
            # In a loader worker the default collate says "Trying to resize storage", not what differs.
            if self.default and RAGGED_HINT not in said and isinstance(batch, list) and not same_shapes(batch):
                said += RAGGED_HINT
            raise BadBatch(said) from exc.__cause__
        except USER_CODE_ERRORS as exc:
            if is_out_of_memory(exc) or is_shm_full(exc):
                raise
            raise BadBatch(hinted(f"what the dataset's __getitems__ returned ({describe_batch(batch)}) cannot be "
                                  f"collated: {type(exc).__name__}: {exc}")) from exc
