"""Which modules of a model train: those its factory left in eval mode stay there.

A fine-tuning recipe freezes a backbone and puts it in eval mode, so that its
BatchNorm layers keep the pretrained running statistics (and its dropout
stays off) while the head trains. ``model.train()`` alone would switch them
back and let the statistics drift. A model whose every module is in eval
mode (loaded for inference, say) trains whole, as ``model.train()`` makes it.
The emitted ``train.py`` does the same (``eval_modules`` in ``autotune/output/templates/shared.py.tmpl``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def eval_modules(model: Any) -> tuple[Any, ...]:
    """The modules of ``model`` (itself included) its factory left in eval mode; none when every one is.

    Read once, as the model is built: :func:`train_mode` keeps them in eval mode while the rest trains.
    """
    modules = list(model.modules())
    kept = tuple(m for m in modules if not m.training)
    return () if len(kept) == len(modules) else kept


def train_mode(model: Any, kept: tuple[Any, ...]) -> None:
    """``model.train()``, then each module of ``kept`` (:func:`eval_modules`) back in eval mode, that module alone
    (a module in training mode under one in eval mode stays as the factory left it)."""
    model.train()
    for module in kept:
        module.training = False


def has_batch_norm(model: Any) -> bool:
    """Whether ``model`` holds a BatchNorm layer that trains (statistics over each micro-batch): one its factory left in
    eval mode (a frozen backbone's) stays there in the trials and train.py (:func:`train_mode`)."""
    import torch

    kept = {id(m) for m in eval_modules(model)}
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and id(m) not in kept for m in model.modules())


@contextmanager
def left_as_found(model: Any) -> Iterator[None]:
    """Within it, ``model`` may be trained on a batch or two (the parent's check of a Task); on exit its modules' modes,
    its buffers (BatchNorm's running statistics) and its parameters' gradients are as they were. A Task given a model
    object (a notebook's pretrained one) is that object: the check left it in training mode, its statistics moved by
    the check's batch, and gradients on it."""
    import torch

    modes = [(module, module.training) for module in model.modules()]
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    grads = [(parameter, parameter.grad) for parameter in model.parameters()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
        with torch.no_grad():
            for buffer, kept in buffers:
                buffer.copy_(kept)
        for parameter, grad in grads:
            parameter.grad = grad


@contextmanager
def random_state_kept() -> Iterator[None]:
    """Within it, the caller's process may draw from torch's CPU generator and Python's ``random`` (a Task's factory
    initialising a model, the check's batches and training step); on exit both are as they were. A notebook seeded
    once drew other numbers after ``autotune.search`` on a Task than without it."""
    import random

    import torch

    python = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):  # the CPU's generator only: no CUDA device is touched in the parent
            yield
    finally:
        random.setstate(python)
