"""How a Task's items become a batch, as a DataLoader makes it: item by item through the collate function, or through
the dataset's own batched read (``__getitems__``); and whether batches keep their shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.errors import USER_CODE_ERRORS, WorkloadError, is_out_of_memory
from autotune.workloads.batches import describe_batch, hinted
from autotune.workloads.data import BadData

if TYPE_CHECKING:  # pragma: no cover
    from autotune.workloads.task import Task

__all__ = ["ItemsWrapper", "bad_item", "batched_fixed_shapes", "batched_read", "collate_items", "failing_item", "fixed_shapes", "read_batch",
           "same_shapes"]


def same_shapes(items: list[Any]) -> bool:
    """Whether every item holds tensors of the same shapes."""
    from autotune.workloads.batches import tensors

    shapes = {tuple(tuple(t.shape) for t in tensors(item)) for item in items}
    return len(shapes) <= 1


def fixed_shapes(task: Task, items: list[Any]) -> bool:
    """Whether every batch keeps its shapes (then cuDNN autotuning is safe).

    Judged on the items and on each item collated alone: token lists a
    ``collate_fn`` pads hold no tensors until collated. A collate that fails
    alone counts as changing shapes (the knob is then not offered).
    """
    try:
        return same_shapes(items) and same_shapes([task.collate([item]) for item in items])
    except USER_CODE_ERRORS:
        return False


def collate_items(collate: Callable[[list[Any]], Any], items: list[Any], label: str = "dataset item") -> Any:
    """``items`` through ``collate`` (a Task's :meth:`~autotune.Task.collate`); one line naming the item at fault if
    that fails (``label`` and its place: the search reads the dataset's first items, a loader's batch holds any)."""
    try:
        return collate(items)
    except USER_CODE_ERRORS as exc:
        # Name the item at fault: the first that does not collate alone, else the mix.
        for index, item in enumerate(items):
            try:
                collate([item])
            except USER_CODE_ERRORS as alone:  # its own error: the batch's may be another item's (a ragged list beside a None)
                raise WorkloadError(
                    hinted(f"{label} {index} ({describe_batch(item)}) cannot be collated: {type(alone).__name__}: {alone}")
                ) from alone
        first: dict[str, int] = {}  # each kind of item once, at its first place: a loader's batch holds hundreds
        for index, item in enumerate(items):
            first.setdefault(describe_batch(item), index)
        kinds = ", ".join(f"item {i}: {kind}" for kind, i in list(first.items())[:4]) + (", ..." if len(first) > 4 else "")
        raise WorkloadError(hinted(f"{label}s 0..{len(items) - 1} cannot be collated together ({kinds}): {type(exc).__name__}: {exc}")) from exc


def batched_read(dataset: Any) -> Callable[[list[int]], Any] | None:
    """The dataset's own batched read (``__getitems__``), which a DataLoader calls instead of ``__getitem__`` and
    hands to the collate function as it returns it (a list, a dict, a tensor); ``None`` where it has none."""
    read = getattr(dataset, "__getitems__", None)
    return read if callable(read) else None


def read_batch(task: Task, indices: list[int]) -> Any:
    """The first batch a DataLoader makes of ``indices`` through the dataset's own ``__getitems__`` and the Task's
    collate_fn (or PyTorch's default); one line if either fails.

    Raises:
        BadData: The read failed (the data's fault, whichever run meets it).
        WorkloadError: The collation failed.
    """
    read = batched_read(task.dataset)
    assert read is not None
    span = f"[{indices[0]}]" if len(indices) == 1 else f"[{indices[0]}..{indices[-1]}]"
    try:
        data = read(list(indices))
    except USER_CODE_ERRORS as exc:
        if is_out_of_memory(exc):  # the batch's size may be at fault: a memory pre-pass halves it
            raise
        where, error = failing_item(task.dataset, indices) or (f"dataset.__getitems__({span})", exc)
        raise bad_item(error, where) from None
    if isinstance(data, list):  # items, as a Subset's batched read returns them: the item at fault is named
        return collate_items(task.collate, data)
    try:
        return task.collate(data)
    except USER_CODE_ERRORS as exc:
        raise WorkloadError(
            f"what dataset.__getitems__({span}) returned ({describe_batch(data)}) cannot be collated: {type(exc).__name__}: {exc}"
        ) from None


def bad_item(exc: BaseException, item: str) -> BaseException:
    """``exc``, raised reading ``item``, as :class:`BadData` in one line; running out of memory stays itself (the
    batch's size may be at fault: a memory pre-pass halves it)."""
    if is_out_of_memory(exc):
        return exc
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return BadData(f"{item} failed: {type(exc).__name__}: {first}")


def failing_item(dataset: Any, indices: list[int]) -> tuple[str, BaseException] | None:
    """``dataset[i]`` and its error for the first of ``indices`` whose item raises when read alone (a Subset's batched
    read is its items'); None when each reads, or where ``__getitem__`` is not the dataset's (``Dataset``'s own raises
    NotImplementedError: a dataset read only in batches, as is one that has none)."""
    if not hasattr(type(dataset), "__getitem__"):
        return None
    for index in indices:
        try:
            dataset[index]
        except NotImplementedError:
            return None
        except USER_CODE_ERRORS as exc:
            return f"dataset[{index}]", exc
    return None


def batched_fixed_shapes(task: Task, indices: list[int]) -> bool:
    """:func:`fixed_shapes` for a dataset with its own ``__getitems__``: each index read and collated alone."""
    try:
        return same_shapes([read_batch(task, [index]) for index in indices])
    except WorkloadError:
        return False


class ItemsWrapper:
    """A map-style dataset that hands the error of an item that raises to :meth:`failed`, with the item's index: the
    trial's and the emitted script's wrappers each raise it their own way."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except USER_CODE_ERRORS as exc:
            self.failed(exc, index)
            raise  # as it is, where failed() raised nothing else

    def failed(self, exc: BaseException, index: int) -> None:
        """Raise what ``exc``, met reading ``dataset[index]``, becomes; return to let it pass as it is."""
