"""What a Task's loss takes and reaches: targets the default loss (cross-entropy over classes) would train on without a
word, outputs and targets an element-wise loss broadcasts, a step that calls backward itself, and whether a loss reaches
the model's parameters at all."""

from __future__ import annotations

import math
import re
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.errors import WorkloadError
from autotune.units import counted

if TYPE_CHECKING:
    from autotune.workloads.task import Task


def float_targets(output: Any, targets: Any) -> tuple[str, str, str] | None:
    """What float ``targets`` shaped as ``output`` are, why, and the loss to pass, where they are no class probabilities
    (values in [0, 1] summing to 1 over the classes, as label smoothing or mixup make): multi-hot rows (a multi-label
    task) or other values (regression: cross-entropy trained on them without a word, its losses negative). None for
    probabilities or other targets."""
    import torch

    if not (isinstance(output, torch.Tensor) and isinstance(targets, torch.Tensor) and targets.is_floating_point()
            and targets.shape == output.shape and targets.dim() >= 2):
        return None
    values = targets.detach().float()
    sums = values.sum(dim=1)
    if bool(((values == 0) | (values == 1)).all()) and bool((sums > 1).any()):
        return "rows of 0 and 1 with several 1s", "a multi-label task", "nn.BCEWithLogitsLoss())"
    if bool(((values >= 0) & (values <= 1)).all()) and bool((((sums - 1).abs() <= 1e-3) | (sums == 0)).all()):
        return None  # probabilities; a row of zeros (a masked position) adds nothing to cross-entropy
    return ("float values shaped as the output, no class probabilities", "a regression task, say",
            "...), such as nn.MSELoss() for regression")


def reaches(loss: Any, parameters: list[Any]) -> bool | None:
    """Whether the autograd graph of ``loss`` reaches any of ``parameters``, walked without a backward pass (no gradient
    memory, and reentrant activation checkpointing, which refuses ``torch.autograd.grad``, is no error). None where the
    walk meets a node it cannot see through (a checkpointed segment): not known, so not refused."""
    wanted, seen, stack = {id(p) for p in parameters}, set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if id(getattr(node, "variable", None)) in wanted:  # a parameter's AccumulateGrad
            return True
        if "Checkpoint" in type(node).__name__:
            return None
        stack.extend(following for following, _ in node.next_functions)
    return False


def check_loss_weights(task: Task, model: Any, optimizer: Any) -> None:
    """Refuse a ``loss=`` module with trainable parameters of its own (learned loss weights, an ArcFace head) that the
    optimizer does not train: it gets the model's (a loss that holds the model, a weight penalty, holds those)."""
    import torch

    if not isinstance(task.loss, torch.nn.Module):
        return
    trained = {id(p) for p in model.parameters()} | {id(p) for group in optimizer.param_groups for p in group["params"]}
    weights = sum(p.numel() for p in task.loss.parameters() if p.requires_grad and id(p) not in trained)
    if weights:
        raise WorkloadError(
            f"the Task's loss ({type(task.loss).__name__}) holds {counted(weights, 'trainable parameter')}, which the optimizer never "
            "sees (it gets the model's) and no checkpoint keeps: put them in the model, or give step= a model that holds both "
            "(autotune.Task(model=WithLoss(net, loss), step=lambda model, batch: model(*batch)), its forward returning the loss); "
            "if they are not meant to train, freeze them (loss.requires_grad_(False))")


def gradients(model: Any) -> list[Any]:
    """A copy of each parameter's ``.grad`` (None where it has none), to compare after a Task's ``step`` ran."""
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def check_no_backward(model: Any, before: list[Any]) -> None:
    """Refuse a ``step`` that called ``backward()`` itself: a parameter's gradient is nonzero now and other than before.

    With ``retain_graph=True`` nothing fails later: the trial's own backward would double every gradient. A step that
    computes input gradients with ``torch.autograd.grad``, or calls backward and then zeroes the gradients (an
    adversarial step), leaves them as they were or zero; the model's gradients are compared, not cleared, so a Python
    caller's own model keeps its own.

    Raises:
        WorkloadError: The step changed the model's gradients.
    """
    import torch

    for parameter, was in zip(model.parameters(), before, strict=True):
        now = parameter.grad
        if now is not None and bool(now.detach().any()) and (was is None or not torch.equal(was, now.detach())):
            raise WorkloadError("step(model, batch) computed the gradients itself (the model's .grad changed when it returned: it "
                                "called backward()); it must return the loss only: the trial (and train.py) call backward, with the "
                                "gradient scaler and accumulation, and a second backward would double every gradient")


def pass_warnings(warned: list[warnings.WarningMessage], broadcast: Callable[[str], str]) -> None:
    """Warn again what the first batch's loss warned of, as it would have; PyTorch's broadcast warning of an element-wise
    loss whose broadcast makes more values than either side holds (an ``[N, 1]`` output against ``[N]`` targets: ``[N, N]``)
    is refused instead (``broadcast(message)`` says why), since the loss would train without an error. A broadcast that
    keeps the larger side's shape (a constant target row against every sample) is meant: warned as it was."""
    for said in warned:
        text = str(said.message)
        if BROADCAST_WARNING in text and _grows(text):
            raise WorkloadError(broadcast(text.split(". ", 1)[0]))
        warnings.warn_explicit(said.message, said.category, said.filename, said.lineno, module=_module_of(said.filename))


def _module_of(filename: str) -> str | None:
    """The name of the imported module whose file is ``filename`` (``torch.nn.functional``), so a user's
    ``filterwarnings(module=...)`` matches the warning warned again; None: Python derives one from the file name."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return None


def _grows(message: str) -> bool:
    """Whether the two sizes PyTorch's broadcast warning names broadcast to more values than the larger holds (True when
    they cannot be read from it)."""
    import torch

    sizes = [tuple(int(d) for d in found.split(",") if d.strip()) for found in re.findall(r"torch\.Size\(\[([\d, ]*)\]\)", message)]
    if len(sizes) != 2:
        return True
    try:
        both = torch.broadcast_shapes(*sizes)
    except RuntimeError:
        return True
    return math.prod(both) > max(math.prod(size) for size in sizes)


#: What PyTorch's element-wise losses (MSE, L1, smooth L1, Huber) warn when the targets' shape differs from the output's:
#: they broadcast the two, an [N, 1] output against [N] targets into an [N, N] loss, and train without an error.
BROADCAST_WARNING = "that is different to the input size"


#: The names a forward's second parameter takes where it is the batch's targets (a torchvision detector's ``targets``).
TARGET_NAMES = ("target", "targets", "label", "labels", "y")


def one_argument_hint(model: Any, exc: BaseException, loss_given: bool) -> str:
    """Without ``step=`` the model is called with the batch's inputs alone: what to say where its forward failed and
    takes more than them (``forward(a, b)`` missing ``b``; a torchvision detector's ``forward(images, targets=None)``,
    which asserts on the targets it was not given); "" otherwise (a ``forward(x, mask=None)`` whose failure is its own)."""
    import inspect

    forward = getattr(type(model), "forward", None)
    own = f"{getattr(forward, '__qualname__', 'forward')}() missing"  # the model's own forward, not a submodule's
    missing = isinstance(exc, TypeError) and str(exc).startswith(own) and "required positional argument" in str(exc)
    try:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = [p.name for p in inspect.signature(model.forward).parameters.values() if p.kind in kinds]
    except (TypeError, ValueError, AttributeError):  # no signature to read
        names = []
    if not missing and not (len(names) > 1 and names[1].lower() in TARGET_NAMES):
        return ""
    with_loss = "with loss=" if loss_given else "with the default loss"
    return (f"; {with_loss}, the model is called with one argument, the batch's inputs: for a model that takes several "
            "(a torchvision detector's images and targets), give step=lambda model, batch: ... instead")
