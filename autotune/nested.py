"""The tensors of a nested batch (a tensor, a tuple or list, a dict, a dataclass instance, or a mix of them): find, map, move."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["as_channels_last", "dataclass_fields", "map_tensors", "tensors", "to_device"]


def dataclass_fields(value: Any) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of a dataclass instance (a ``Batch(x=..., y=...)`` a collate_fn returns); none for anything else."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.fields(value)
    return ()


def tensors(batch: Any) -> Iterator[Any]:
    """Every tensor of a batch, depth first, in order (dict values in their order)."""
    import torch

    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from tensors(value)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            yield from tensors(value)
    else:
        for field in dataclass_fields(batch):
            yield from tensors(getattr(batch, field.name))


def map_tensors(batch: Any, func: Callable[[Any], Any], other: Callable[[Any], Any] | None = None) -> Any:
    """The batch with ``func`` applied to each tensor; containers keep their type. ``other``, where given, is applied to
    each value that is neither a tensor nor a container looked into (the rest pass through as they are)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return func(batch)
    if isinstance(batch, Mapping):
        mapped = {key: map_tensors(value, func, other) for key, value in batch.items()}
        if type(batch) is dict:
            return mapped
        try:  # keep dict subclasses (OrderedDict, BatchEncoding) where they rebuild from a dict
            return type(batch)(mapped)  # type: ignore[call-arg]
        except Exception:
            return mapped
    if other is not None and not isinstance(batch, (Mapping, list)) and callable(getattr(type(batch), "to", None)):
        return other(batch)  # a namedtuple or dataclass with a mover of its own (PackedSequence keeps batch_sizes on the CPU)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(map_tensors(value, func, other) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(value, func, other) for value in batch)
    fields = dataclass_fields(batch)
    if fields:  # a copy with each field mapped: frozen, slotted and init=False fields too, without rerunning __post_init__
        mapped_batch = copy.copy(batch)
        for field in fields:
            object.__setattr__(mapped_batch, field.name, map_tensors(getattr(batch, field.name), func, other))
        return mapped_batch
    return other(batch) if other is not None else batch


def as_channels_last(tensor: Any) -> Any:
    """A 4-D floating tensor (images) in the NHWC layout; any other tensor as it is."""
    import torch

    if tensor.dim() == 4 and tensor.is_floating_point():
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def to_device(batch: Any, device: Any, *, channels_last: bool = False) -> Any:
    """Move every tensor of ``batch`` to ``device``.

    The copy is non-blocking only from pinned memory (where it overlaps with
    compute); with ``channels_last`` every 4-D floating tensor is converted
    to the NHWC layout, other tensors are left as they are. An object of another class with a ``to`` method (a
    ``Batch`` a collate_fn returns, a graph library's batch) moves itself, as PyTorch's convention has it: its
    ``to(device)`` is called (its tensors keep their layout).
    """

    def move(tensor: Any) -> Any:
        tensor = tensor.to(device, non_blocking=bool(tensor.is_pinned()) if tensor.device.type == "cpu" else False)
        return as_channels_last(tensor) if channels_last else tensor

    def move_itself(value: Any) -> Any:
        if isinstance(value, type) or not callable(getattr(value, "to", None)):
            return value
        moved = value.to(device)
        return value if moved is None else moved  # a to() that moves in place returns nothing

    return map_tensors(batch, move, move_itself)
