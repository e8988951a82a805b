"""What a Task's loss takes and reaches: targets the default loss (cross-entropy over classes) would train on without a
word, and whether a loss reaches the model's parameters at all."""

from __future__ import annotations

from typing import Any


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
    if bool(((values >= 0) & (values <= 1)).all()) and bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3)):
        return None
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
