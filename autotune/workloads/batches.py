"""Batches of any shape: a tensor, a tuple or list, a dict, a dataclass instance, or a nested mix.

The trial loop and the emitted script treat every batch the same way: move
its tensors to the device (recursively, ``non_blocking`` only from pinned
memory), convert 4-D floating tensors to channels_last when the setup asks
for it, and count its samples as the first dimension of its first tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.errors import WorkloadError
from autotune.nested import dataclass_fields, map_tensors, tensors, to_device

__all__ = ["describe_batch", "first_dim", "first_tensor", "has_image_tensor", "map_tensors", "tensors", "to_device"]


def has_image_tensor(batch: Any) -> bool:
    """Whether the batch holds a 4-D floating tensor (where channels_last can apply)."""
    return any(t.dim() == 4 and t.is_floating_point() for t in tensors(batch))


def first_tensor(batch: Any) -> Any:
    """The first tensor of a batch (depth first) that has a dimension, the one :func:`first_dim` counts; ``None`` if none."""
    return next((tensor for tensor in tensors(batch) if tensor.dim() > 0), None)


def first_dim(batch: Any) -> int:
    """Samples in a batch: the size of the first dimension of its first tensor.

    Raises:
        WorkloadError: The batch holds no tensor with a dimension.
    """
    tensor = first_tensor(batch)
    if tensor is not None:
        return int(tensor.shape[0])
    raise WorkloadError(
        f"cannot count the samples of a {type(batch).__name__} batch: it holds no tensor where autotune looks (tensors, "
        "tuples, lists, dicts and dataclasses, nested); give the Task a batch_size_of= (a function of the batch)"
    )


def describe_batch(batch: Any) -> str:
    """Shapes and dtypes of a batch, e.g. ``{input_ids: Tensor[2, 16] int64, labels: Tensor[2] int64}``."""
    import torch

    if isinstance(batch, torch.Tensor):
        dtype = str(batch.dtype).removeprefix("torch.")
        return f"Tensor[{', '.join(str(d) for d in batch.shape)}] {dtype}"
    if isinstance(batch, Mapping):
        return "{" + ", ".join(f"{key}: {describe_batch(value)}" for key, value in batch.items()) + "}"
    if isinstance(batch, (tuple, list)):
        inner = ", ".join(describe_batch(value) for value in batch)
        return f"({inner})" if isinstance(batch, tuple) else f"[{inner}]"
    fields = dataclass_fields(batch)
    if fields:
        return type(batch).__name__ + "(" + ", ".join(f"{f.name}: {describe_batch(getattr(batch, f.name))}" for f in fields) + ")"
    return type(batch).__name__


#: PyTorch's default collate on items of different shapes; its message names no dataset index.
_RAGGED = "stack expects each tensor to be equal size"
#: The same on items holding lists of different lengths (token ids not yet tensors).
_RAGGED_LISTS = "each element in list of batch should be of equal size"
RAGGED_HINT = ("; items of one batch differ in shape: give the workload a collate_fn (autotune.Task(collate_fn=...)) that pads "
               "them, or that keeps them in lists where the model takes lists (a torchvision detector's images and targets: "
               "lambda items: tuple(zip(*items)))")


#: What autograd says when the loss's graph was already freed: a ``step`` that called ``backward()`` itself.
_TWICE = "backward through the graph a second time"
_TWICE_HINT = ("; does the workload's step(model, batch) call backward()? It must return the loss only: the trial (and "
               "train.py) call backward, with the gradient scaler and accumulation")


#: DDP on a model with parameters that got no gradient in a step.
_UNUSED = "Expected to have finished reduction in the prior iteration"
_UNUSED_HINT = ("; some of the model's parameters get no gradient in a step (not used in its forward): set requires_grad=False "
                "on those it never uses; a model whose forward skips some in some steps (a branch per step, layer drop, "
                "experts) needs find_unused_parameters, which DDP trials do not measure: search it without --nproc-per-node "
                "(the emitted train.py takes --find-unused-parameters)")

#: BatchNorm training on a batch that gives it one value per channel (one sample, at a 1x1 feature map for a 2-D one).
_ONE_VALUE = "Expected more than 1 value per channel when training"
_ONE_VALUE_HINT = "; a BatchNorm layer needs more than one value per channel to train on: a batch of 2 or more samples"

#: A float64 input met float32 weights: torch's words for Linear, Conv (with a bias), and both without one (torchvision's
#: ResNets' convolutions).
_DOUBLE = ("got Double and Float", "Input type (double) and bias type (float)", "expected scalar type Double but found Float",
           "but got: double != float")
_DOUBLE_HINT = ("; the inputs are float64 (NumPy's default dtype) and the model's weights float32: make the items float32 "
                "(torch.as_tensor(x, dtype=torch.float32), or x.astype(np.float32))")


#: float32 inputs met bfloat16 or float16 weights (Linear; Conv with a bias).
_HALF = ("got Float and BFloat16", "got Float and Half", "but got: float != c10::BFloat16", "but got: float != c10::Half",
         "Input type (float) and bias type (c10::BFloat16)", "Input type (float) and bias type (c10::Half)",
         "Input type (torch.FloatTensor) and weight type (CPUBFloat16Type)", "Input type (torch.FloatTensor) and weight type (torch.HalfTensor)")
_HALF_HINT = ("; the inputs are float32 and the model's weights 16-bit: cast the inputs in the Task's step (or loss inputs), or "
              "keep the weights in float32: autocast, which the search tries as amp=bf16, computes in 16 bits")

#: A model whose parameters were never materialised (built on the meta device).
_META = "Tensor on device meta is not on"
_META_HINT = ("; the model's parameters are on the meta device (shapes only, no values): materialise them in the factory "
              "(model.to_empty(device='cpu'), then initialise or load the weights)")


#: PyTorch's default collate on an item holding None (a missing label, an optional field).
_NONE = "found <class 'NoneType'>"
_NONE_HINT = ("; an item holds None, which PyTorch's default collate cannot batch: return a value there (a tensor, a number, "
              "a string), or give the workload a collate_fn (autotune.Task(collate_fn=...)) that keeps such fields in lists")


#: A model given a list where a tensor goes: an item's Python list, which default_collate turns into one tensor per
#: position (a tuple there is as often a model's own tuple output handed on in a step: no hint for it).
_LISTED = ("must be Tensor, not list",)
_LISTED_HINT = ("; default_collate turns an item's Python list of numbers into one tensor per position, not one tensor "
                "(unless the Task's collate_fn stacks it): return a tensor from __getitem__ (torch.tensor(values, dtype=torch.float32))")


def hinted(error: str) -> str:
    """``error`` with what fixes it, where the message alone does not say."""
    hints = ((_RAGGED, RAGGED_HINT), (_RAGGED_LISTS, RAGGED_HINT), (_TWICE, _TWICE_HINT), (_UNUSED, _UNUSED_HINT),
             (_ONE_VALUE, _ONE_VALUE_HINT), (_META, _META_HINT), (_NONE, _NONE_HINT), *((double, _DOUBLE_HINT) for double in _DOUBLE),
             *((half, _HALF_HINT) for half in _HALF), *((listed, _LISTED_HINT) for listed in _LISTED))
    for cause, hint in hints:
        if cause in error:
            return error + hint
    return error
