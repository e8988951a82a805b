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


class FilledRate(float):
    """A Task's ``lr`` it filled in itself (``lr=`` left out), a float all the same: ``dataclasses.replace`` passes it
    back to a new Task, which still knows that the user gave none."""


def default_rate(factory: Callable[..., Any] | None) -> FilledRate:
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
    return FilledRate(default if usable else 1e-3)


def needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` requires its ``closure`` (LBFGS re-evaluates the loss itself)."""
    import inspect

    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def checks_gradient_kinds(model: Any, optimizer: Any) -> bool:
    """Whether :func:`gradient_kind_mismatch` must see one backward's gradients: ``optimizer`` takes sparse gradients
    only (``SparseAdam``), or dense ones only (torch's Adam, AdamW: autotune's default) beside an ``nn.Embedding`` or
    ``nn.EmbeddingBag`` made with ``sparse=True``. Other optimizers, and models without such a module, are left as given."""
    import torch

    if isinstance(optimizer, torch.optim.SparseAdam):
        return True
    sparse = any(isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse for m in model.modules())
    return sparse and isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)


def gradient_kind_mismatch(model: Any, optimizer: Any) -> str | None:
    """What ``optimizer.step()`` would refuse of the gradients one backward left on ``model`` (see
    :func:`checks_gradient_kinds`): dense gradients for ``SparseAdam``, sparse ones for Adam or AdamW; None when none."""
    import torch

    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    grads = [(name, p.grad) for name, p in model.named_parameters() if id(p) in trained and p.grad is not None]
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SparseAdam):
        if dense := [n for n, grad in grads if not grad.is_sparse]:
            return (f"the Task's optimizer {name} takes sparse gradients only, and {_named(dense)} get dense ones: a Task trains "
                    "with one optimizer, so freeze those (requires_grad_(False)) or use Adagrad, which takes both")
        return None
    if sparse := [n for n, grad in grads if grad.is_sparse]:
        return (f"the Task's optimizer {name} does not take sparse gradients, and {_named(sparse)} get them (an nn.Embedding or "
                "nn.EmbeddingBag made with sparse=True): make them dense (sparse=False), or give the Task an optimizer that takes "
                "sparse gradients (Adagrad; SparseAdam where nothing else trains)")
    return None


def _named(names: list[str]) -> str:
    """``3 of the model's parameters (a, b, c, ...)``."""
    more = ", ..." if len(names) > 3 else ""
    return f"{len(names)} of the model's parameters ({', '.join(names[:3])}{more})"


def own_rate_warnings(optimizer: Any, lr: float, batch: int, given: float | None) -> list[str]:
    """What to say of an optimizer whose factory sets its own rate (``lr``, read from it): the Task's ``lr=``
    (``given``, None where the Task left it out) that it replaces, where they differ, and :func:`scheduler_warning`'s."""
    said = [] if given is None or math.isclose(given, lr, rel_tol=1e-6) else [
        f"warning: the Task's lr={given:g} is not used: its optimizer factory sets its own rate, {lr:g} (its first param group's), "
        "which the search reads as your recipe's and scales; pass that rate as the Task's lr, or let the factory take lr="]
    return said + [w for w in [scheduler_warning(optimizer, lr, batch)] if w is not None]


def scheduler_warning(optimizer: Any, lr: float, batch: int) -> str | None:
    """The warning for an optimizer the Task's factory built with a learning-rate scheduler attached (its param groups
    hold ``initial_lr``, which torch's ``LRScheduler`` sets): the rate read as the recipe's is the schedule's first,
    and a rate scaled for another batch holds only until the scheduler's first step sets its own from its
    ``base_lrs``. None for an optimizer without one."""
    if not any("initial_lr" in group for group in getattr(optimizer, "param_groups", ())):
        return None
    return (f"warning: the Task's optimizer carries a learning-rate scheduler (its param groups hold initial_lr, which torch's "
            f"LRScheduler sets): {lr:g}, read as your recipe's rate, is the schedule's first, and where the search changes the "
            "effective batch, the rate it scales for it holds only until the scheduler's first step sets its own; pass "
            f"--effective-batch {batch} to keep your recipe's math, or build the scheduler in your own loop over "
            "task.build_optimizer(...) (docs/workloads.md)")


def unpacking_hint(exc: BaseException) -> str:
    """What to add to the error of an optimizer factory written for ``named_parameters()`` pairs (``for n, p in
    params``), which gets the model's parameters themselves: ``""`` for any other error."""
    if re.search(r"values to unpack|cannot unpack non-iterable|'(Tensor|Parameter)' object has no attribute '(startswith|endswith|split)'"
                 r"|__contains__ only supports Tensor or scalar", str(exc)):  # a name read from what is a parameter
        return ("; the factory gets a list of the model's parameters, not (name, parameter) pairs: to group them by name, "
                "build the model first and close over it (Task(model=model, optimizer=lambda params: SGD([... "
                "model.named_parameters() ...]))")
    return ""
