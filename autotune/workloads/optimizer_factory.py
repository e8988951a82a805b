"""What a Task's optimizer factory says of itself: the rate it sets, whether it sets ``lr`` beside ``**kwargs``, its own
default rate, and whether its optimizer's ``step()`` needs a closure (:class:`~autotune.workloads.task.Task` asks)."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def first_rate(optimizer: torch.optim.Optimizer) -> float | None:
    """The recipe's rate of an optimizer whose factory sets its own: its first param group's that is not 0 (a group at
    rate 0, such as a backbone held still while a head trains, scales to 0 whatever the batch); ``None`` if all are."""
    return next((float(group["lr"]) for group in optimizer.param_groups if float(group["lr"]) > 0), None)


def passes_its_own_lr(factory: Callable[..., Any]) -> bool:
    """Whether a ``**kwargs`` optimizer factory sets ``lr`` itself beside them (``SGD(params, lr=0.1, **kwargs)``, or
    ``SGD(params, 0.1, **kwargs)``) or builds an optimizer that takes none: built once over a dummy parameter with
    ``lr=`` given, it fails on that keyword."""
    import torch

    try:
        factory([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    except TypeError as exc:  # lr given twice (by keyword or by position), or an optimizer that takes no lr
        return re.search(r"multiple values for (keyword )?argument 'lr'|unexpected keyword argument 'lr'", str(exc)) is not None
    except Exception:  # the factory wants real parameters: taken as passing lr= on; building it says what is wrong
        return False
    return False


def default_rate(factory: Callable[..., Any] | None) -> float:
    """A Task's rate when none is given: the factory's own ``lr`` default (a finite number > 0), else AdamW's 1e-3.
    Given ``lr=1e-3`` instead, ``def make(params, lr=0.05)`` trained 50 times slower than the recipe, without a word."""
    import inspect

    default: Any = None
    try:
        if factory is not None:
            default = inspect.signature(factory).parameters["lr"].default
    except (TypeError, ValueError, KeyError):  # no signature (a builtin), or no lr argument: the factory sets its own rate
        pass
    usable = isinstance(default, numbers.Real) and not isinstance(default, bool) and 0 < float(default) < math.inf
    return float(default) if usable else 1e-3


def needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` requires its ``closure`` (LBFGS re-evaluates the loss itself)."""
    import inspect

    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def dense_for_sparse_only(model: Any, optimizer: Any) -> list[str]:
    """The names of the model's parameters that ``optimizer`` trains though it takes sparse gradients only
    (``torch.optim.SparseAdam``) and they get dense ones: every parameter but the weight of an ``nn.Embedding`` or
    ``nn.EmbeddingBag`` made with ``sparse=True``. Empty for any other optimizer."""
    import torch

    if not isinstance(optimizer, torch.optim.SparseAdam):
        return []
    sparse = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse}
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return [name for name, p in model.named_parameters() if id(p) in trained and id(p) not in sparse]
