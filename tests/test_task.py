"""The user's workload: the Task record, its parent-side checks, batches of any shape, and a Task search with a fake runner."""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import in_process
import pytest
import torch
from typer.testing import CliRunner

import autotune
from autotune.cli import app
from autotune.devices import DeviceInfo
from autotune.errors import SetupError, UsageError, WorkloadError
from autotune.output.best import read_best
from autotune.output.emit import render_script
from autotune.records import LoaderPoint, TrialOptions, TrialResult, Workload
from autotune.runner.failures import classify
from autotune.train_setup import TrainSetup
from autotune.tuner import SearchConfig, run_search
from autotune.tuner.calibrate import calibrate
from autotune.tuner.constraints import parse_constraint
from autotune.tuner.loader_ceiling import workers_broken
from autotune.tuner.space import build_space, defaults_setup
from autotune.workloads.batches import describe_batch, first_dim, has_image_tensor, to_device
from autotune.workloads.tasks import build_task_workload, check_task, task_ref

CPU = DeviceInfo("cpu", bf16=True, memory_total_bytes=None, memory_free_bytes=None, label="test CPU")
cli = CliRunner()


def _workload(name: str, workers: bool = True) -> Workload:
    return build_task_workload(f"task_factories:{name}", device="cpu", workers=workers)


# --------------------------------------------------------------- the record
def test_task_keeps_the_public_signature_and_rejects_loss_with_step() -> None:
    task = autotune.Task(torch.nn.Linear(2, 2), [1, 2], batch_size=8, lr=0.1)
    assert (task.loss, task.step, task.collate_fn, task.optimizer, task.batch_size, task.lr) == (None, None, None, None, 8, 0.1)
    with pytest.raises(TypeError):
        autotune.Task(torch.nn.Linear(2, 2), [1], None)  # type: ignore[misc]  # loss= is keyword-only
    with pytest.raises(WorkloadError, match="loss= or step=, not both"):
        autotune.Task(torch.nn.Linear(2, 2), [1], loss=torch.nn.MSELoss(), step=lambda m, b: b)
    # Built without a word, refused only once a search or trial checked the Task (the Python API's callers build it first).
    with pytest.raises(WorkloadError, match="^Task model must be an nn.Module or a factory of one, got NoneType$"):
        autotune.Task(None, [1])
    with pytest.raises(WorkloadError, match="^Task dataset must be a torch.utils.data.Dataset, got None$"):
        autotune.Task(torch.nn.Linear(2, 2), None)
    with pytest.raises(WorkloadError, match="batch_size"):
        autotune.Task(torch.nn.Linear(2, 2), [1], batch_size=0)
    for lr in (float("inf"), float("nan"), 0.0):  # as --lr: an infinite rate was taken, and every trial diverged
        with pytest.raises(WorkloadError, match=f"^Task lr must be a finite number > 0, got {lr}$"):
            autotune.Task(torch.nn.Linear(2, 2), [1], lr=lr)
    # The criterion's class where its instance belongs would fail later as "Boolean value of Tensor ... is ambiguous".
    with pytest.raises(WorkloadError, match=re.escape("Task loss is the class MSELoss, not a loss function: pass an instance (loss=MSELoss())")):
        autotune.Task(torch.nn.Linear(2, 2), [1], loss=torch.nn.MSELoss)


def test_a_tuple_of_input_and_target_tensors_is_told_to_be_a_tensor_dataset() -> None:
    """dataset=(inputs, targets), as fit(X, y) takes them, is a dataset of two items, the whole tensors: the check said
    they "differ in shape: give the workload a collate_fn that pads them"."""
    inputs, targets = torch.randn(64, 8), torch.randint(0, 2, (64,))
    with pytest.raises(WorkloadError, match=re.escape(
            "Task dataset is a tuple of 2 tensors (Tensor[64, 8] float32, Tensor[64] int64), whose items are the whole tensors; "
            "for the 64 samples along their first dimension pass torch.utils.data.TensorDataset(inputs, targets)")):
        autotune.Task(torch.nn.Linear(8, 2), (inputs, targets))
    samples = tuple(torch.randn(8) for _ in range(4))  # a tuple of samples of one shape stays a dataset of them
    assert autotune.Task(torch.nn.Linear(8, 2), samples).dataset is samples
    assert autotune.Task(torch.nn.Linear(8, 2), (inputs, targets), collate_fn=lambda items: items).dataset[1] is targets


def test_a_dict_of_columns_a_generator_and_a_step_returning_logs_say_what_to_change() -> None:
    """Three habits of other training code: a dict of column tensors as the dataset (`dataset[0] failed: KeyError: 0`),
    a generator as the dataset, and a step returning (loss, logs): each was refused without what to do instead."""
    columns = {"x": torch.randn(30, 8), "y": torch.randint(0, 2, (30,))}
    with pytest.raises(WorkloadError, match=re.escape(
            "Task dataset is a dict of tensors ('x': Tensor[30, 8] float32, 'y': Tensor[30] int64), whose items would be looked "
            "up by key (dataset[0]); for the samples along their first dimension pass torch.utils.data.TensorDataset(*columns)")):
        autotune.Task(torch.nn.Linear(8, 2), columns)
    assert autotune.Task(torch.nn.Linear(8, 2), {0: torch.randn(8), 1: torch.randn(8)}).dataset  # a dict keyed by index stays
    rows = ((torch.randn(8), 1) for _ in range(4))
    with pytest.raises(WorkloadError, match="is neither a map-style Dataset .* nor an IterableDataset; a generator is used up after "
                                            "one pass: give an IterableDataset whose __iter__ makes a new one each time"):
        check_task(autotune.Task(torch.nn.Linear(8, 2), rows, batch_size=2), workers=False)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8)))  # a loader of the user's own
    with pytest.raises(WorkloadError, match=r"nor an IterableDataset; pass its .dataset \(and collate_fn=its .collate_fn\)"):
        check_task(autotune.Task(torch.nn.Linear(8, 2), loader, batch_size=2), workers=False)
    data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.randint(0, 2, (8,)))

    def step(model: torch.nn.Module, batch: Any) -> Any:
        x, y = batch
        out = model(x)
        return torch.nn.functional.cross_entropy(out, y), {"accuracy": (out.argmax(1) == y).float().mean()}

    with pytest.raises(WorkloadError, match=r"must return a scalar floating tensor, got tuple; return the loss alone \(logs such as"):
        check_task(autotune.Task(torch.nn.Linear(8, 2), data, step=step, batch_size=4), workers=False)


def test_a_loss_modules_own_tensors_follow_the_models_output_to_its_device() -> None:
    # A class weight of nn.CrossEntropyLoss built on the CPU, as a Task factory builds it: on a GPU every trial (and
    # train.py) failed "Expected all tensors to be on the same device". The meta device stands in for CUDA here.
    weight = torch.tensor([1.0, 3.0])
    task = autotune.Task(lambda: torch.nn.Linear(4, 2, device="meta"), [1], loss=torch.nn.CrossEntropyLoss(weight=weight))
    batch = (torch.zeros(8, 4, device="meta"), torch.zeros(8, dtype=torch.long, device="meta"))
    loss = task.compute_loss(task.build_model(), batch)
    assert loss.device.type == "meta" and loss.dim() == 0
    assert task.loss is not None and task.loss.weight.device.type == "meta"  # type: ignore[union-attr]

    class SideOutput(torch.nn.Module):  # a CPU side tensor beside the logits: the loss is left where the user built it
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2, device="meta")

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.zeros(1), self.linear(x)

    class OnLogits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.ones(2, device="meta"))

        def forward(self, output: tuple[torch.Tensor, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
            return (output[1] * self.scale).sum()

    task = autotune.Task(SideOutput, [1], loss=OnLogits())
    assert task.compute_loss(task.build_model(), batch).device.type == "meta"
    assert task.loss is not None and task.loss.scale.device.type == "meta"  # type: ignore[union-attr]


def test_optimizer_factory_gets_the_scaled_lr() -> None:
    task = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=lambda params, lr: torch.optim.SGD(params, lr=lr))
    optimizer = task.build_optimizer(task.build_model().parameters(), lr=0.25, cuda=False)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.25
    default = autotune.Task(torch.nn.Linear(2, 2), [1]).build_optimizer(torch.nn.Linear(2, 2).parameters(), lr=0.5, cuda=False)
    assert isinstance(default, torch.optim.AdamW)
    # A factory without lr= sets its own rates (here 0.1 and 0.01): the first group's is the recipe's rate, whatever
    # the Task's lr says, and the scaling applies to each group with their ratio kept.
    groups = lambda params: torch.optim.SGD([{"params": [p], "lr": 0.1 if i == 0 else 0.01} for i, p in enumerate(params)], lr=0.01)  # noqa: E731
    own = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=groups, lr=0.01)
    unscaled = own.build_optimizer(own.build_model().parameters(), lr=None, cuda=False)
    assert [g["lr"] for g in unscaled.param_groups] == [0.1, 0.01] and own.recipe_lr(unscaled) == 0.1
    assert [g["lr"] for g in own.build_optimizer(own.build_model().parameters(), lr=0.1, cuda=False).param_groups] == [0.1, 0.01]
    assert [g["lr"] for g in own.build_optimizer(own.build_model().parameters(), lr=0.2, cuda=False).param_groups] == [0.2, 0.02]
    assert task.recipe_lr(optimizer) == task.lr  # a factory that takes lr= is given the Task's


def test_an_optimizer_factory_may_read_its_params_twice_for_param_groups() -> None:
    """A factory that builds a group of weights, then one of biases, reads ``params`` twice: given the generator
    ``model.parameters()``, the biases' group came out empty, and trials and train.py never trained them."""
    def by_shape(params: Any) -> torch.optim.Optimizer:
        weights = [p for p in params if p.ndim > 1]
        return torch.optim.SGD([{"params": weights, "weight_decay": 1e-4}, {"params": [p for p in params if p.ndim <= 1]}],
                               lr=0.1, momentum=0.9)

    task = autotune.Task(torch.nn.Linear(8, 2), [1], optimizer=by_shape)
    model = task.build_model()
    optimizer = task.build_optimizer(model.parameters(), lr=0.2, cuda=False)
    assert [len(group["params"]) for group in optimizer.param_groups] == [1, 1]
    assert optimizer.param_groups[1]["params"][0] is model.bias


def test_the_recipe_rate_of_a_factory_without_lr_is_its_own() -> None:
    # Task.lr is left at 1e-3; the factory sets 0.1: the note, best.json and the script scale 0.1, the rate it trains at.
    work = _workload("sgd_own_rate")
    assert work.lr == 0.1 and work.lr_scaling == "linear"
    assert _workload("sgd_groups").lr == 0.1  # a factory taking lr= is given Task.lr (0.1 there)
    # A partial that binds lr= sets its own rate too: the user's 0.1, not the Task's default 1e-3, scaled for each group.
    bound = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9))
    unscaled = bound.build_optimizer(bound.build_model().parameters(), lr=None, cuda=False)
    assert bound.recipe_lr(unscaled) == 0.1 and bound.lr_scaling(unscaled) == "linear"
    assert bound.build_optimizer(bound.build_model().parameters(), lr=0.4, cuda=False).param_groups[0]["lr"] == 0.4
    unbound = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=functools.partial(torch.optim.SGD, momentum=0.9), lr=0.2)
    assert unbound.recipe_lr(unbound.build_optimizer(unbound.build_model().parameters(), lr=None, cuda=False)) == 0.2


def test_a_task_lr_that_the_factory_s_own_rate_replaces_is_said() -> None:
    """Task(lr=1e-3, optimizer=lambda params: SGD(params, lr=0.01, ...)): the search trained 0.01 without a word."""
    said: list[str] = []
    work = build_task_workload("task_factories:sgd_own_rate_beside_a_given_lr", device="cpu", warn=said.append)
    assert work.lr == 0.1
    assert ("warning: the Task's lr=0.001 is not used: its optimizer factory sets its own rate, 0.1 (its first param group's), "
            "which the search reads as your recipe's and scales; pass that rate as the Task's lr, or let the factory take lr=") in said
    import dataclasses
    import json

    left_out = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    copied = dataclasses.replace(left_out, batch_size=8)  # replace passes the filled-in rate back: still none given
    assert not copied._lr_given and copied.lr == 1e-3 and json.dumps(copied.lr) == "0.001"
    assert dataclasses.replace(autotune.Task(torch.nn.Linear(2, 2), [1], lr=1e-3), batch_size=8)._lr_given
    for quiet in ("sgd_own_rate", "sgd_groups", "good"):  # lr= left out; a factory given lr=; the default AdamW
        said.clear()
        build_task_workload(f"task_factories:{quiet}", device="cpu", warn=said.append)
        assert not any("is not used" in line for line in said), (quiet, said)


def test_a_model_whose_to_override_returns_nothing_is_refused_before_any_trial() -> None:
    """It passed the check and failed in the calibration as "TrainSetup.prepare_model takes a torch.nn.Module, got
    NoneType", naming a helper the user never called."""
    class MovesWithoutReturning(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

        def to(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
            super().to(*args, **kwargs)  # the return forgotten

    with pytest.raises(WorkloadError, match=r"^the model's to\(\) returned NoneType, not the module: an override of to\(\) must return self"):
        autotune.Task(MovesWithoutReturning, [1]).build_model()


    class WantsADevice(torch.nn.Linear):
        def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            if not args and not kwargs:
                raise ValueError("to() needs a device or dtype")
            return super().to(*args, **kwargs)

    assert isinstance(autotune.Task(WantsADevice(2, 2), [1]).build_model(), WantsADevice)  # the probe only: trials call to(device)


def test_an_optimizer_whose_step_needs_a_closure_is_refused_before_any_trial() -> None:
    """LBFGS passed the check and failed about 25 s into the calibration with "missing ... 'closure'", no reason said."""
    task = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=lambda params: torch.optim.LBFGS(params, lr=0.1))
    with pytest.raises(WorkloadError, match=r"^the Task's optimizer LBFGS needs a closure in step\(\) \(as LBFGS does\); the trials"):
        task.build_optimizer(task.build_model().parameters(), lr=None, cuda=False)


def test_an_optimizer_factory_over_other_parameters_is_refused_before_any_trial() -> None:
    """A factory that ignored its params (``lambda params: SGD(other.parameters(), ...)``) passed the check: the search
    reported a speedup and train.py ran its epochs while the model's weights never changed. A factory that trains only
    some of them (a fine-tuned head) is the user's choice."""
    other = torch.nn.Linear(2, 2)
    data = [(torch.randn(2), i % 2) for i in range(8)]
    task = autotune.Task(torch.nn.Linear(2, 2), data, batch_size=4, optimizer=lambda params: torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(WorkloadError, match=r"^the Task's optimizer factory returned a SGD that holds none of the parameters it was given"):
        check_task(task, workers=False)
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 2))
    head = autotune.Task(model, data, batch_size=4, optimizer=lambda params: torch.optim.SGD(model[1].parameters(), lr=0.1))
    check_task(head, workers=False)


@pytest.mark.parametrize("width", [2, 3])  # rows of a 2-wide weight unpack into (n, p): the name read fails later
def test_an_optimizer_factory_written_for_named_parameters_is_told_what_it_gets(width: int) -> None:
    """The common "groups by name" factory (`for n, p in params if n.startswith(...)`) failed with a bare `too many
    values to unpack (expected 2)` (or `'Tensor' object has no attribute 'startswith'`): its params are parameters."""
    data = [(torch.randn(2), i % 2) for i in range(8)]
    model = torch.nn.Sequential(torch.nn.Linear(2, width), torch.nn.Linear(width, 2))
    by_name = autotune.Task(model, data, batch_size=4,
                            optimizer=lambda params: torch.optim.SGD([p for n, p in params if n.startswith("0.")], lr=0.1))
    with pytest.raises(WorkloadError, match=r"^the Task's optimizer factory failed: \w+Error: .*; the factory gets a list of the "
                                            r"model's parameters, not \(name, parameter\) pairs: to group them by name, build"):
        check_task(by_name, workers=False)


def test_an_optimizer_built_with_a_scheduler_is_warned_of() -> None:
    """A fine-tuning recipe's warm-up built inside the optimizer factory (a Task takes no scheduler): the rate read as
    the recipe's was the schedule's first (0.005 for 0.05), and train.py's scaled rate held until the scheduler's first
    step set its own, the unscaled schedule, without a word. The search now says so before its first trial."""
    data = [(torch.randn(2), i % 2) for i in range(8)]

    def scheduled(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD(params, lr=0.05)
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))  # stepped by the user's own hook
        return optimizer

    said: list[str] = []
    info = check_task(autotune.Task(torch.nn.Linear(2, 2), data, batch_size=4, optimizer=scheduled), workers=False, warn=said.append)
    assert info.lr == pytest.approx(0.005) and said == [
        "warning: the Task's optimizer carries a learning-rate scheduler (its param groups hold initial_lr, which torch's "
        "LRScheduler sets): 0.005, read as your recipe's rate, is the schedule's first, and where the search changes the "
        "effective batch, the rate it scales for it holds only until the scheduler's first step sets its own; pass "
        "--effective-batch 4 to keep your recipe's math, or build the scheduler in your own loop over task.build_optimizer(...) "
        "(docs/workloads.md)"]
    said.clear()
    check_task(autotune.Task(torch.nn.Linear(2, 2), data, batch_size=4, optimizer=lambda params: torch.optim.SGD(params, lr=0.05)),
               workers=False, warn=said.append)

    def given_its_rate(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:  # its schedule starts from lr=
        optimizer = torch.optim.SGD(params, lr=lr)
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
        return optimizer

    check_task(autotune.Task(torch.nn.Linear(2, 2), data, batch_size=4, lr=0.05, optimizer=given_its_rate), workers=False, warn=said.append)
    assert said == []


class Bag(torch.nn.Module):
    """An embedding (sparse gradients where ``sparse``) and a dense head, trained on token ids."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(50, 8, sparse=sparse)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class LookUp(torch.nn.Module):
    """A hand-written sparse lookup (``F.embedding(..., sparse=True)``): no Embedding module says it is sparse."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(50, 2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(tokens, self.table, sparse=True).mean(1)


def test_an_optimizer_that_cannot_take_the_model_s_gradients_is_refused_before_any_trial() -> None:
    """SparseAdam over dense gradients, or AdamW (autotune's default) over an nn.Embedding(sparse=True), passed the check
    and failed in the calibration's first step ("SparseAdam does not support dense gradients"). One backward in the check
    tells which gradients are sparse: a frozen parameter or a hand-written sparse lookup is no reason to refuse."""
    data = [(torch.randint(0, 50, (5,)), i % 2) for i in range(8)]
    for sparse, dense in ((False, "3 of the model's parameters (embed.weight, head.weight, head.bias)"),
                          (True, "2 of the model's parameters (head.weight, head.bias)")):
        with pytest.raises(WorkloadError, match=rf"^the Task's optimizer SparseAdam takes sparse gradients only, and {re.escape(dense)} "
                                                r"get dense ones: a Task trains with one optimizer, so freeze those"):
            check_task(autotune.Task(Bag(sparse), data, batch_size=4, optimizer=torch.optim.SparseAdam), workers=False)
    with pytest.raises(WorkloadError, match=r"^the Task's optimizer AdamW does not take sparse gradients, and 1 of the model's "
                                            r"parameters \(embed.weight\) get them \(an nn.Embedding or nn.EmbeddingBag made with sparse=True\)"):
        check_task(autotune.Task(Bag(True), data, batch_size=4), workers=False)  # autotune's default optimizer
    frozen = Bag(True)
    frozen.head.requires_grad_(False)
    check_task(autotune.Task(frozen, data, batch_size=4, optimizer=torch.optim.SparseAdam), workers=False)
    check_task(autotune.Task(Bag(True), data, batch_size=4, optimizer=torch.optim.Adagrad), workers=False)
    check_task(autotune.Task(LookUp(), data, batch_size=4, optimizer=torch.optim.SparseAdam), workers=False)
    assert all(p.grad is None for p in frozen.parameters())  # the check's backward left no gradient behind


def test_a_factory_s_own_default_rate_is_the_recipe_s_when_the_task_gives_none() -> None:
    """``def make(params, lr=0.05)`` with no Task(lr=...) was given 1e-3, the Task's old default: the recipe's SGD trained
    50 times slower in the trials, best.json and train.py, without a word. An lr given to the Task stands over it."""
    def make_sgd(params: Any, lr: float = 0.05) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    task = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=make_sgd)
    assert task.lr == 0.05
    assert task.build_optimizer(task.build_model().parameters(), lr=None, cuda=False).param_groups[0]["lr"] == 0.05
    assert autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=make_sgd, lr=0.01).lr == 0.01
    assert autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=torch.optim.Adadelta).lr == 1.0  # the class's own default
    assert autotune.Task(torch.nn.Linear(2, 2), [1]).lr == 1e-3  # the default AdamW's
    # lr=None says "the factory's own rate" where the factory sets it: accepted, not refused as "got None".
    bound = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=functools.partial(torch.optim.SGD, lr=0.1), lr=None)
    assert bound.recipe_lr(bound.build_optimizer(bound.build_model().parameters(), lr=None, cuda=False)) == 0.1


def test_a_param_group_at_rate_0_is_not_the_recipe_s_rate() -> None:
    """A factory whose first group holds a backbone still (rate 0) was refused as 'learning rate must be > 0, got 0.0';
    the first group that trains sets the recipe's rate, and the group at 0 stays at 0 when the rate is scaled."""
    work = _workload("frozen_by_rate")
    assert work.lr == 0.1 and work.lr_scaling == "linear"
    import task_factories

    task = task_factories.frozen_by_rate()
    scaled = task.build_optimizer(task.build_model().parameters(), lr=0.4, cuda=False)
    assert [g["lr"] for g in scaled.param_groups] == [0.0, 0.4]
    with pytest.raises(WorkloadError, match=r"^the Task's optimizer factory sets a learning rate of 0 in every param group"):
        _workload("still_everywhere")


def test_the_learning_rate_rule_follows_the_optimizer_family() -> None:
    task = autotune.Task(torch.nn.Linear(2, 2), [1])
    params = list(torch.nn.Linear(2, 2).parameters())

    class MyAdam(torch.optim.Adam):
        pass

    assert task.lr_scaling(torch.optim.AdamW(params)) == "sqrt"
    assert task.lr_scaling(MyAdam(params)) == "sqrt"  # subclasses keep their family
    assert task.lr_scaling(torch.optim.RMSprop(params)) == "sqrt"
    assert task.lr_scaling(torch.optim.SGD(params, lr=0.1)) == "linear"
    assert task.lr_scaling(torch.optim.Adafactor(params)) == "sqrt"  # torch's own adaptive optimizer

    class AdamW8bit(torch.optim.Optimizer):  # another library's Adam, no subclass of torch's
        def __init__(self, params: Any, lr: float = 1e-3) -> None:
            super().__init__(params, {"lr": lr})

    assert task.lr_scaling(AdamW8bit(params)) == "sqrt"
    for name in ("Lamb", "AdaBelief"):  # torch_optimizer's LAMB (its paper scales by the square root), AdaBelief
        adaptive = type(name, (torch.optim.Optimizer,), {})
        assert task.lr_scaling(adaptive(params, {"lr": 1e-3})) == "sqrt"
    # A step whose size the rate sets (sign-based, line-search, parameter-free): no batch rule, the rate is kept.
    assert task.lr_scaling(torch.optim.Rprop(params)) == "none" and task.lr_scaling(torch.optim.LBFGS(params)) == "none"
    for name in ("Lion", "DAdaptAdam", "Prodigy", "SignSGD"):  # DAdaptAdam's lr is a multiplier near 1: no Adam here
        kept = type(name, (torch.optim.Optimizer,), {})
        assert task.lr_scaling(kept(params, {"lr": 1.0})) == "none", name
    assert task.lr_scaling(torch.optim.ASGD(params)) == "linear"  # averaged SGD: SGD's rule
    if hasattr(torch.optim, "Muon"):  # torch >= 2.9
        assert task.lr_scaling(torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))])) == "none"  # orthogonalized updates
    # The nearest torch class decides, not a name that merely holds a part: SGD's and AdamW's subclasses keep their rules.
    million, pavilion = type("MillionStepSGD", (torch.optim.SGD,), {}), type("PavilionAdamW", (torch.optim.AdamW,), {})
    assert task.lr_scaling(million(params, lr=0.1)) == "linear" and task.lr_scaling(pavilion(params)) == "sqrt"


def test_numpy_numbers_are_taken_as_python_ones() -> None:
    """A recipe read with NumPy (np.int64(16), np.float32(3e-4)): Python's int and float, as best.json writes them."""
    import numpy

    task = autotune.Task(torch.nn.Linear(2, 2), [1], batch_size=numpy.int64(16), lr=numpy.float32(3e-4))
    assert type(task.batch_size) is int and task.batch_size == 16
    assert type(task.lr) is float and task.lr == 3e-4  # its shortest decimal form, as best.json shows it
    from fractions import Fraction

    assert autotune.Task(torch.nn.Linear(2, 2), [1], lr=Fraction(1, 1000)).lr == 0.001  # its text, 1/1000, is no float
    with pytest.raises(WorkloadError, match="batch_size must be an integer >= 1, got 16.0"):
        autotune.Task(torch.nn.Linear(2, 2), [1], batch_size=16.0)  # type: ignore[arg-type]


def test_a_factory_taking_kwargs_is_given_the_tasks_lr() -> None:
    # def make(params, **kwargs): return AdamW(params, **kwargs) takes lr=: it trains at Task.lr, not AdamW's default 1e-3.
    def make(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, weight_decay=0.1, **kwargs)

    task = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=make, lr=3e-4)
    unscaled = task.build_optimizer(task.build_model().parameters(), lr=None, cuda=False)
    assert unscaled.param_groups[0]["lr"] == 3e-4 and task.recipe_lr(unscaled) == 3e-4
    assert task.build_optimizer(task.build_model().parameters(), lr=6e-4, cuda=False).param_groups[0]["lr"] == 6e-4

    # def make(params, **kwargs): return SGD(params, lr=0.1, **kwargs) sets its own rate: its 0.1 is the recipe's.
    def own_rate(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, **kwargs)

    def own_rate_by_position(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, 0.1, momentum=0.9, **kwargs)

    for factory in (own_rate, own_rate_by_position):
        task = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=factory, lr=3e-4)
        unscaled = task.build_optimizer(task.build_model().parameters(), lr=None, cuda=False)
        assert unscaled.param_groups[0]["lr"] == 0.1 and task.recipe_lr(unscaled) == 0.1
        assert task.build_optimizer(task.build_model().parameters(), lr=0.2, cuda=False).param_groups[0]["lr"] == 0.2


def test_a_kwargs_factory_is_tried_once_per_task_not_once_per_optimizer() -> None:
    # Whether a **kwargs factory sets lr itself is found by building it once over a dummy parameter: once per Task.
    calls: list[int] = []

    def make(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
        calls.append(1)
        return torch.optim.SGD(params, lr=0.1, **kwargs)

    task = autotune.Task(torch.nn.Linear(2, 2), [1], optimizer=make)
    for lr in (None, 0.2, 0.4):
        optimizer = task.build_optimizer(task.build_model().parameters(), lr=lr, cuda=False)
        assert task.recipe_lr(optimizer) == 0.1 if lr is None else optimizer.param_groups[0]["lr"] == lr
    assert len(calls) == 1 + 3  # the one try, then the three optimizers


def _local() -> None:  # pragma: no cover - only referenced
    pass


class _Factories:
    @staticmethod
    def make() -> None:  # pragma: no cover - only referenced
        pass


@pytest.mark.parametrize(("ref", "why"), [
    ("try.wl:make", "'try' is a Python keyword: the trial processes import it by name, so rename that folder, or put the folder "
                    "that holds the module on PYTHONPATH"),
    ("my-exp.train:make", "'my-exp' is not a Python name (letters, digits and _, not starting with a digit): the trial processes"),
    ("my-exp:my-exp", "'my-exp' is not a Python name (letters, digits and _, not starting with a digit): the trial processes import "
                      "it by name, so rename that file)"),
    ("pkg.mod:class", "'class' is a Python keyword: the trial processes import it by name, so rename the function)"),
    ("pkg.mod:Cls.make", "'Cls.make' is not a Python name (letters, digits and _, not starting with a digit): the trial processes "
                         "import it by name, so name a function at the top level of the module)"),
    ("pkg.mod:", "no function is named after the ':')"),
    (" pkg.mod:f", "' pkg' has spaces at its ends: remove them)"),
    # Arguments, which a reference cannot carry: before, "rename the function", whose name was fine.
    ("pkg.mod:make(n=300)", "'make(n=300)' passes arguments, and the trial processes call the factory without any: write a function "
                            "without arguments that calls make(...) with them, and name it)"),
    ("pkg.mod::make", "the reference has two ':' in a row: one separates the module from the function)"),
])
def test_a_workload_reference_names_the_part_an_import_cannot_take(ref: str, why: str) -> None:
    """A folder named ``try`` or ``my-exp`` was refused as "not a valid reference; expected package.module:function", which
    the reference already looked like."""
    expected = rf"^workload '{re.escape(ref)}' is not a valid reference; expected package.module:function \({re.escape(why)}"
    with pytest.raises(WorkloadError, match=expected):
        task_ref(ref)


def test_workload_callables_the_trials_cannot_import_are_refused_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import task_factories

    assert task_ref(task_factories.good) == "task_factories:good"
    with pytest.raises(WorkloadError, match=r"^workload <lambda> is a lambda, which the trial processes cannot import by its own "
                                            r"name; define it at the top level of an importable module"):
        task_ref(lambda: None)
    # A lambda bound to a name at a module's top level: that name imports it ('task_factories:as_lambda' works).
    monkeypatch.setattr(task_factories, "as_lambda", eval("lambda: good()", vars(task_factories)), raising=False)
    with pytest.raises(WorkloadError, match=r"a lambda, which .* by its own name; it is bound to task_factories.as_lambda: pass "
                                            r"'task_factories:as_lambda', or define it"):
        task_ref(task_factories.as_lambda)
    # A built Task: each trial process builds its own, from the function.
    with pytest.raises(WorkloadError, match=r"^workload is a built autotune.Task: every trial process builds its own, so pass the function"):
        task_ref(task_factories.good())
    # '__main__:f' names the user's script here, found in this process; in a trial process __main__ is autotune's own.
    import importlib.machinery

    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "__file__", "/home/me/train_it.py", raising=False)
    with pytest.raises(WorkloadError, match=r"^workload '__main__:make_task': __main__ is the script run, which the trial processes "
                                            r"cannot import; name its module instead: 'train_it:make_task', with the call to autotune "
                                            r"under if __name__"):
        task_ref("__main__:make_task")
    # python -m mypkg.train: the module's own name, not its file's stem.
    monkeypatch.setattr(main, "__spec__", importlib.machinery.ModuleSpec("mypkg.train", None), raising=False)
    with pytest.raises(WorkloadError, match=r"name its module instead: 'mypkg.train:make_task'"):
        task_ref("__main__:make_task")
    # The autotune command itself (python -m autotune search --workload __main__:f): no module of the user's to name.
    monkeypatch.setattr(main, "__spec__", importlib.machinery.ModuleSpec("autotune.__main__", None), raising=False)
    with pytest.raises(WorkloadError, match=r"^workload '__main__:make_task': __main__ names no module of yours here .*; pass "
                                            r"package.module:function"):
        task_ref("__main__:make_task")

    def nested() -> None:
        pass

    with pytest.raises(WorkloadError, match=r"is a nested function, which"):
        task_ref(nested)
    cell: dict[str, Any] = {"__name__": "notebook_cell"}  # a function defined by exec(), as notebook tools do
    exec("def make_task():\n    pass\n", cell)
    with pytest.raises(WorkloadError, match=r"^workload make_task: its module 'notebook_cell' was loaded under a name the trial "
                                            r"processes cannot import \(made by exec\(\)\?\); define it"):
        task_ref(cell["make_task"])

    with pytest.raises(WorkloadError, match=r"^workload make is a method or an attribute of a class, which the trial processes cannot"):
        task_ref(_Factories.make)
    # A module loaded from a file under another name (importlib's spec_from_file_location): the trials cannot import it.
    import importlib.util

    spec = importlib.util.spec_from_file_location("renamed_factories", task_factories.__file__)
    assert spec is not None and spec.loader is not None
    renamed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(renamed)
    with pytest.raises(WorkloadError, match=r"^workload good: its module 'renamed_factories' was loaded under a name the trial processes cannot"):
        task_ref(renamed.good)
    # Run by runpy under its own name (never imported, so not in sys.modules): importable by that name, so taken.
    import runpy

    (tmp_path / "run_by_runpy.py").write_text("def make_task():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "run_by_runpy" not in sys.modules
    assert task_ref(runpy.run_module("run_by_runpy", run_name="run_by_runpy")["make_task"]) == "run_by_runpy:make_task"
    in_main = functools.wraps(_local)(lambda: None)
    in_main.__module__, in_main.__qualname__, in_main.__name__ = "__main__", "make_task", "make_task"
    with pytest.raises(WorkloadError, match="defined in __main__"):
        task_ref(in_main)
    # No name to import: read as 'functools:', and refused as "model 'functools:' is not a valid factory reference".
    with pytest.raises(WorkloadError, match=r"^workload partial object: the trial processes import the workload by its name, so it must be a function"):
        task_ref(functools.partial(task_factories.good))

    class Factory:
        def __call__(self) -> autotune.Task:
            return task_factories.good()

    with pytest.raises(WorkloadError, match=r"^workload Factory object: .* \(not a functools.partial or a callable object\)"):
        task_ref(Factory())
    with pytest.raises(WorkloadError, match="package.module:function") as refused:
        task_ref("just_a_name")
    assert "torchvision" not in str(refused.value)
    # A torchvision model name where a workload goes (autotune.search("resnet18"): its first argument is the workload).
    with pytest.raises(WorkloadError, match=r"a factory returning autotune.Task\); 'resnet18' is a torchvision model: --model "
                                            r"takes it, to tune it on images \(the classifier shorthand\)$"):
        task_ref("resnet18")
    with pytest.raises(WorkloadError, match=r"'resnet18' is a torchvision model: model takes it, to tune it on images"):
        autotune.search("resnet18", trials=1)  # as the API's caller reads it
    with pytest.raises(WorkloadError, match="name the module, not its file: train:make_task"):
        task_ref("train.py:make_task")
    with pytest.raises(WorkloadError, match="not its file: pkg.train:make_task"):
        task_ref("pkg/train.py:make_task")
    # No dotted name reaches a file given by an absolute path or through '..' (work.main.pkg.train would not import).
    for given in ("/work/main/pkg/train.py", "../main/pkg/train.py"):
        with pytest.raises(WorkloadError, match=r"not its file: from (/work|\.\.)/main/pkg \(or with it on PYTHONPATH\) pass "
                                                r"train:make_task$"):
            task_ref(f"{given}:make_task")


def test_a_workload_module_that_parses_its_arguments_at_import_is_told_about_the_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training script whose top level runs argparse exits on autotune's own arguments: the one line says so."""
    (tmp_path / "parses_at_import.py").write_text(
        "import argparse\n"
        "from task_factories import good as make_task\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--epochs', type=int, required=True)\n"
        "args = parser.parse_args()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["autotune", "search", "--workload", "parses_at_import:make_task"])
    with pytest.raises(WorkloadError) as info:
        build_task_workload("parses_at_import:make_task", device="cpu")
    assert str(info.value) == (
        "importing 'parses_at_import' for workload 'parses_at_import:make_task' failed: SystemExit: 2; its top level exits when "
        'imported: put the script\'s own code under if __name__ == "__main__":')


def test_a_workload_module_that_searches_at_import_is_refused_with_the_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that calls autotune.search() at its top level, without the __main__ guard, is imported by the search
    (and by every trial): the import started a second search, which failed in its trials naming the first one's --out lock."""
    (tmp_path / "searches_at_import.py").write_text(
        "import autotune\n"
        "from task_factories import good as make_task\n"
        f"autotune.search(workload='searches_at_import:make_task', trials=1, device='cpu', out={str(tmp_path / 'out')!r})\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkloadError) as info:
        build_task_workload("searches_at_import:make_task", device="cpu")
    assert str(info.value) == (
        "importing 'searches_at_import' for workload 'searches_at_import:make_task' starts autotune again: its top level "
        'calls autotune.search() or autotune.trial(), and every trial process imports it; put that call under if __name__ == "__main__":'
    )
    assert not (tmp_path / "out").exists()
    assert "searches_at_import" not in sys.modules
    # The refusal is for the nested import only: the next import of the module is checked anew.
    (tmp_path / "searches_at_import.py").write_text("from task_factories import good as make_task\n")
    assert build_task_workload("searches_at_import:make_task", device="cpu").images == 40


def test_a_workload_file_named_like_another_module_is_refused_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test.py in the user's directory: this process (cwd first on sys.path under python -m) imported it, every trial
    (the user's directories last) imported the standard library's test package and failed 'has no function'."""
    factory = "from task_factories import good as make_task\n"
    (tmp_path / "test.py").write_text(factory)
    (tmp_path / "typer.py").write_text(factory)  # an installed package's name (typer, imported already)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkloadError, match=re.escape(f"{tmp_path / 'test.py'} for workload 'test:make_task' has the name of a "
                                                      "module of Python's standard library (")) as info:
        build_task_workload("test:make_task", device="cpu")
    assert str(info.value).endswith("test/__init__.py), which imports find first; rename it")
    import typer

    with pytest.raises(WorkloadError, match=re.escape(f"'typer' for workload 'typer:make_task' imported {typer.__file__}, not "
                                                      f"your {tmp_path / 'typer.py'}: an installed module of that name comes first")):
        build_task_workload("typer:make_task", device="cpu")


SHIFTY = """import torch
import autotune

N, WIDTH = {n}, {width}


def make_task():
    data = torch.utils.data.TensorDataset(torch.randn(N, 8), torch.randint(0, 3, (N,)))
    return autotune.Task(torch.nn.Sequential(torch.nn.Linear(8, WIDTH), torch.nn.Linear(WIDTH, 3)), data, batch_size=8)
"""


def test_a_trial_that_builds_another_task_than_the_search_checked_fails_in_one_line(tmp_path, monkeypatch) -> None:
    """A notebook's session: a module global changed after the import, or the file edited without importlib.reload.
    The search's checks saw the session's Task, the trial processes (which import the module from its file) another,
    and measured it while the batch caps and notes followed the first. The module's own directory comes first in the
    trials' import path, ahead of a working directory changed since (which held another module of that name)."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    (home / "shifty_task.py").write_text(SHIFTY.format(n=40, width=4))
    (elsewhere / "shifty_task.py").write_text(SHIFTY.format(n=24, width=4))
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.delitem(sys.modules, "shifty_task", raising=False)
    import shifty_task

    monkeypatch.chdir(elsewhere)  # %cd in a notebook, after the import
    outcome = autotune.trial(shifty_task.make_task, device="cpu", trial_seconds=0.5)
    assert outcome.status == "ok" and outcome.workload.images == 40, outcome.result.error  # the file of the module imported
    assert outcome.workload.sys_path[:2] == (str(home), str(elsewhere))
    monkeypatch.setattr(shifty_task, "N", 24)  # the session's global: the trials read the file's 40
    outcome = autotune.trial(shifty_task.make_task, device="cpu", trial_seconds=0.5)
    assert outcome.status == "error" and (outcome.result.error or "").startswith(
        "workload shifty_task:make_task: this trial process built a dataset of 40 samples, the search's own check 24: the trial "
        "processes import the factory's module from its file"), outcome.result.error
    monkeypatch.setattr(shifty_task, "N", 40)
    (home / "shifty_task.py").write_text(SHIFTY.format(n=40, width=6))  # edited, not reloaded: another model in the trials
    outcome = autotune.trial(shifty_task.make_task, device="cpu", trial_seconds=0.5)
    assert outcome.status == "error" and "this trial process built a model of 75 trainable parameters, the search's own " \
        "check 51:" in (outcome.result.error or ""), outcome.result.error


# ------------------------------------------------------------ parent checks
def test_good_workloads_become_workload_records() -> None:
    work = _workload("good")
    assert (work.task, work.images, work.reference_batch, work.lr, work.image_input) == ("task_factories:good", 40, 16, 2e-3, False)
    assert str(Path(__file__).parent) in work.sys_path
    assert Workload.from_dict(json.loads(json.dumps(work.to_dict()))) == work
    # The classifier on --data records no synthetic image count (best.json said 2000 beside the data it named).
    folder = Workload(model="resnet18", image_size=32, device="cpu", data="/data/train", images=500, num_classes=5)
    assert "synthetic_images" not in folder.to_dict() and Workload.from_dict(folder.to_dict()) == folder
    assert _workload("dict_batches").images == 20
    assert _workload("tensor_count").images == 40  # batch_size_of may return an integer 0-d tensor
    assert _workload("numpy_count").images == 40  # or a NumPy integer
    assert _workload("listed_batches_counted").images == 40  # batches of item tuples, counted by the user
    assert _workload("sequence_first_counted").images == 40  # [length, batch] batches, counted by the user along the second dimension
    assert _workload("penalised_loss").images == 40  # a loss that holds the model: its parameters are the model's
    assert _workload("learned_loss_own_optimizer").images == 40  # the loss's own weight, trained by the Task's optimizer
    assert _workload("reentrant_checkpoint").images == 40  # whether its loss reaches the model is walked, not differentiated
    from autotune.workloads.loss_inputs import float_targets

    masked = torch.tensor([[0.25] * 4, [0.0] * 4, [0.0, 0.0, 1.0, 0.0]])  # a zeroed (masked) row adds nothing to cross-entropy
    assert float_targets(torch.zeros(3, 4), masked) is None and float_targets(torch.zeros(3, 4), masked * 3) is not None
    assert _workload("soft_labels").images == 16  # probabilities summing to 1 (label smoothing, mixup): cross-entropy takes them
    assert _workload("shaped_regression").images == 16  # MSELoss on targets shaped as the output
    stream = _workload("iterable")
    assert stream.iterable and stream.images is None
    assert work.lr_scaling == "sqrt" and _workload("sgd").lr_scaling == "linear"  # from the Task's optimizer


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_function", "has no function 'no_such_function'"),
        ("goood", "'task_factories' has no function 'goood' for workload 'task_factories:goood'; did you mean good"),  # a typo
        ("TASK", "'TASK' in 'task_factories' is an object of type Task, not a function, for workload 'task_factories:TASK': name a function "
                 "that returns it (def make_workload(): return TASK)"),
        ("GATE_ENV", "'GATE_ENV' in 'task_factories' is an object of type str, not a function"),  # it read "is a str", "is a int"
        ("not_a_task", "returned int, not an autotune.Task"),
        ("raises", "failed: RuntimeError: no data mounted"),
        ("loss_and_step", "workload task_factories:loss_and_step: Task takes loss= or step=, not both"),
        ("exits", "failed: SystemExit: 3"),  # not autotune's own exit code 3 with nothing said
        ("exiting_stream", "iterating the workload's dataset (ExitingStream) failed: SystemExit: 4"),
        ("empty", "dataset (TensorDataset) is empty"),
        ("uncollatable", "dataset item 1 ((object, int)) cannot be collated"),
        # Item 1's own error, not the batch's (the ragged lists of items 0 and 1), with what fixes it.
        ("none_field", "dataset item 1 ((Tensor[8] float32, int, {tags: [str, str], source: NoneType})) cannot be collated: TypeError: "
                       "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found <class 'NoneType'>; "
                       "an item holds None, which PyTorch's default collate cannot batch"),
        ("ragged", "equal size, but got [3] at entry 0 and [4] at entry 1; items of one batch differ in shape: give the workload a collate_fn"),
        ("ragged_lists", "each element in list of batch should be of equal size; items of one batch differ in shape: give the workload a collate_fn"),
        ("non_scalar_loss", "the loss must return a scalar floating tensor, got Tensor[2] float32"),
        ("frozen_model", "the model has no trainable parameters (none requires grad)"),
        ("detached_loss", "step(model, batch) returned a tensor that does not require grad"),
        ("item_loss", "step(model, batch) must return a scalar floating tensor, got float; return the tensor itself (.item() and "
                      "float() detach it from the graph)"),
        ("nan_loss", "the loss returned nan on the first batch"),
        ("one_output_default_loss", "the model outputs one value per sample (Tensor[2, 1] float32) and the default loss is "
                                    "cross-entropy, which is 0 over a single class: nothing would train; pass autotune.Task(loss=...)"),
        ("multi_hot_default_loss", "the targets are rows of 0 and 1 with several 1s (Tensor[2, 5] float32): a multi-label task, and "
                                   "the default loss is cross-entropy over classes, which takes class indices or probabilities "
                                   "summing to 1; pass autotune.Task(loss=nn.BCEWithLogitsLoss())"),
        ("learned_loss", "the Task's loss (_UncertaintyWeighted) holds 1 trainable parameter, which the optimizer never sees (it "
                         "gets the model's) and no checkpoint keeps: put them in the model, or give step= a model that holds both"),
        ("step_with_another_model", "step(model, batch) returned a loss that no parameter of the model it was given reaches (it "
                                    "computes it with another model, a global one, say)"),
        ("regression_default_loss", "the targets are float values shaped as the output, no class probabilities (Tensor[2, 3] "
                                    "float32): a regression task, say, and the default loss is cross-entropy over classes, which "
                                    "takes class indices or probabilities summing to 1; pass autotune.Task(loss=...), such as "
                                    "nn.MSELoss() for regression"),
        ("broadcast_regression", "the loss got output Tensor[2, 1] float32 and targets Tensor[2] float32 of another shape and "
                                 "broadcasts them (PyTorch's warning), so it would train every output against every target of "
                                 "the batch: give the targets the output's shape (targets.unsqueeze(1)"),
        ("broadcast_step", "step(model, batch) computes a loss whose output and targets differ in shape and broadcast (Using a "
                           "target size (torch.Size([2])) that is different to the input size (torch.Size([2, 1]))), so it would "
                           "train every output against every target of the batch"),
        ("bad_count", "batch_size_of(batch) returned 'x' (str); it must return an int"),
        ("fractional_count", "batch_size_of(batch) returned 3.7 (float); it must return an int"),
        ("zero_count", "batch_size_of(batch) returned 0 for the first batch"),
        ("len_raises", "len(dataset) of the workload's dataset (_LenRaises) failed: TypeError: no len"),
        ("listed_batches", "the first dimension of the batch's first tensor (depth first) counts 8 samples in a batch of 2 items, "
                           "8 in a batch of 1 and 8 in one of 8"),
        ("sequence_first", "counts 12 samples in a batch of 8 items ((Tensor[12, 8] int64, Tensor[8] int64)), where its second "
                           "dimension holds the items: a sequence-first batch"),
        ("forward_fails", "forward failed on the first batch (inputs Tensor[2, 8] float32): RuntimeError"),
        ("needs_arguments", "failed: TypeError: needs_arguments() missing 2 required positional arguments: 'n' and 'm'; a workload factory "
                            "is called with no arguments (n, m have no default): give them defaults, or write a factory without"),
        ("float64_items", "RuntimeError: Input type (double) and bias type (float) should be the same; the inputs are float64 "
                          "(NumPy's default dtype) and the model's weights float32: make the items float32 (torch.as_tensor(x, "),
        ("float64_items_step", "step(model, batch) failed on the first batch [Tensor[2, 3, 8, 8] float64, Tensor[2] int64]: RuntimeError: "
                               "mat1 and mat2 must have the same dtype, but got Double and Float; the inputs are float64 (NumPy's"),
        ("two_inputs", "missing 1 required positional argument: 'b'; with loss=, the model is called with one argument, the "
                       "batch's inputs: for a model that takes several (a torchvision detector's images and targets), give "
                       "step=lambda model, batch: ... instead"),
        ("masked_inside", "TypeError: _TwoInputs.forward() missing 1 required positional argument: 'b'"),  # no step= hint
        ("masked_shape_bug", "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x8 and 16x3)"),  # its own bug: no step= hint
        ("detector_loss", "AssertionError: targets should not be none when in training mode; with loss=, the model is called with "
                          "one argument, the batch's inputs: for a model that takes several (a torchvision detector's images and "
                          "targets), give step=lambda model, batch: ... instead"),
        ("unpicklable", "dataset (_HoldsFile) cannot be pickled for DataLoader workers"),
        ("tuple_output", "must be Tensor, not tuple; the model returns a tuple, and loss= gets it whole: give a loss that takes "
                         "it, or step=lambda model, batch: ... that picks the output to train on"),
        ("tuple_output_default_loss", "the model returns a tuple, and the default loss gets it whole: give a loss that takes it"),
        ("namedtuple_output_default_loss", "the model returns a tuple (_Out), and the default loss gets it whole"),  # not "a _Out"
        ("triples", "the default loss (cross-entropy) needs (inputs, targets) batches, got [Tensor[2, 8] float32, Tensor[2] int64, "
                    "Tensor[2] int64]; give step="),  # no loss= given: the message named one
        ("triples_with_loss", "a Task with loss= needs (inputs, targets) batches, got [Tensor[2, 8] float32, Tensor[2] int64, "),
    ],
)
def test_bad_workloads_fail_in_the_parent_with_one_line(name: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.workloads import tasks

    monkeypatch.setattr(tasks, "worker_start_method", lambda: "spawn")  # workers that unpickle the dataset
    with pytest.raises(WorkloadError) as info:
        _workload(name)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    suggests_step = ("two_inputs", "detector_loss", "tuple_output", "tuple_output_default_loss", "namedtuple_output_default_loss", "learned_loss")
    assert name in suggests_step or "step=lambda" not in str(info.value)  # only where it is the fix
    if name == "raises":  # a Python caller sees the factory's own traceback as the cause (from None hid it)
        assert isinstance(info.value.__cause__, RuntimeError) and info.value.__cause__.__traceback__ is not None
    if name != "needs_arguments":
        assert "called with no arguments" not in str(info.value)


def test_a_broadcast_that_keeps_the_output_s_shape_is_meant_and_passes_with_its_warning() -> None:
    """The step= refusal of a broadcast refused every one PyTorch warned of, also a constant target row against every
    sample's output ([N, 3] against [3]), which trains as meant; only one that makes more values than either side holds
    ([N, 1] against [N]: [N, N]) is refused."""
    with pytest.warns(UserWarning, match="that is different to the input size"):
        assert build_task_workload("task_factories:meant_broadcast_step", device="cpu").task == "task_factories:meant_broadcast_step"
    # Warned again from its own module (the step's, where mse_loss's stacklevel points): a filter on that module silences
    # it, as it would the first warning; Python's own module name for it was the file's path.
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=r"task_factories$")
        build_task_workload("task_factories:meant_broadcast_step", device="cpu")
    assert not [w for w in seen if "different to the input size" in str(w.message)], [str(w.message) for w in seen]


def test_the_arguments_hint_is_only_for_a_factory_that_needs_arguments() -> None:
    from autotune.workloads.models import arguments_hint

    def fine(n: int = 1, *rest: int, **named: int) -> None: ...

    def needs(n: int, *, scale: float) -> None: ...

    assert arguments_hint(fine, TypeError("f() missing 1 required positional argument: 'x'")) == ""  # raised inside it
    assert arguments_hint(needs, RuntimeError("required")) == ""
    assert arguments_hint(needs, TypeError("needs() missing 1 required positional argument: 'n'")).startswith(
        "; a workload factory is called with no arguments (n, scale have no default)")


def test_a_batch_whose_first_tensor_holds_rows_that_vary_per_item_is_refused_naming_batch_size_of() -> None:
    """The EmbeddingBag tutorial's batch (each item's tokens joined) was measured as tokens/s, in best.json and train.py's
    log alike, without a word; a fixed number of rows per item (views stacked, an item that is a chunk of samples) is
    counted as it is, with a note."""
    with pytest.raises(WorkloadError, match=r"the first dimension of the batch's first tensor \(depth first\) counts 7 samples in a "
                       r"batch of 2 items, 3 in a batch of 1 and \d+ in one of 8 .*: it does not count the items .* give "
                       r"autotune.Task\(batch_size_of=...\) the count"):
        build_task_workload("task_factories:tokens_joined", device="cpu")
    assert build_task_workload("task_factories:tokens_joined_counted", device="cpu").task == "task_factories:tokens_joined_counted"
    said: list[str] = []
    assert build_task_workload("task_factories:views_stacked", device="cpu", warn=said.append).task == "task_factories:views_stacked"
    assert said == ["a batch's first tensor holds 2 rows per item (Tensor[4, 8] float32 for 2 items): samples/s counts those rows; "
                    "give autotune.Task(batch_size_of=...) to count otherwise (lambda batch: len(batch[-1]) where the last part "
                    "holds one label per item)"], said


def test_the_check_leaves_the_user_s_model_object_as_it_found_it() -> None:
    """A Task given a model object (a notebook's pretrained one) is checked on that object: it was left in training
    mode, its BatchNorm statistics moved by the check's batch, with gradients on its parameters."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)).eval()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    data = torch.utils.data.TensorDataset(torch.randn(16, 8) * 5 + 3, torch.randint(0, 3, (16,)))
    check_task(autotune.Task(model, data, batch_size=4), workers=False)
    assert not any(module.training for module in model.modules())
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert all(parameter.grad is None for parameter in model.parameters())


def test_near_miss_task_arguments_say_what_to_pass() -> None:
    """Each read as Python's or torch's bare error: the loss by position ("takes 3 positional arguments but 4 were
    given"), the dataset's class ("object of type 'type' has no len()"), an optimizer built over one model ("must be
    callable, got SGD"); a 0-d tensor learning rate was refused as not "a finite number > 0"."""
    with pytest.raises(WorkloadError, match=r"^workload task_factories:loss_by_position failed: TypeError: .*takes 3 positional "
                       r"arguments but 4 were given; autotune.Task takes model and dataset by position, the rest by keyword \(loss="):
        build_task_workload("task_factories:loss_by_position", device="cpu")
    with pytest.raises(WorkloadError, match=r"^Task dataset is the class TensorDataset, not a dataset: pass an instance"):
        autotune.Task(torch.nn.Linear(2, 2), torch.utils.data.TensorDataset)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(WorkloadError, match=r"^Task optimizer must be callable, got SGD \(a factory: optimizer=lambda params: "):
        autotune.Task(model, [1], optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert autotune.Task(model, [1], lr=torch.tensor(3e-4)).lr == pytest.approx(3e-4)
    with pytest.raises(WorkloadError, match=r"^Task lr must be a finite number > 0, got -0.1"):
        autotune.Task(model, [1], lr=torch.tensor(-0.1))


def test_a_task_given_a_sampler_says_what_a_task_takes_and_what_to_do_instead() -> None:
    """Task(sampler=...) was Python's bare TypeError."""
    with pytest.raises(WorkloadError, match=r"^workload task_factories:with_sampler failed: TypeError: .*unexpected keyword argument "
                       r"'sampler'; autotune.Task takes model, dataset and loss, .*; it has no sampler: give the dataset the order"):
        build_task_workload("task_factories:with_sampler", device="cpu")
    # The other DataLoader arguments each say what to do instead (they had only the generic line).
    from autotune.workloads.models import arguments_hint

    for name, clause in (("batch_sampler", "an IterableDataset that yields the bucketed stream"), ("shuffle", "always shuffled"),
                         ("worker_init_fn", "split a stream in its __iter__ by get_worker_info()"), ("drop_last", "whole optimizer steps")):
        said = arguments_hint(lambda: None, TypeError(f"Task.__init__() got an unexpected keyword argument '{name}'"))
        assert clause in said and "it has no sampler" not in said, (name, said)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_float64_inputs_to_a_float32_layer_get_the_hint_whatever_torch_says(kind: str, bias: bool) -> None:
    """torch words the mismatch per layer (with and without a bias: torchvision's ResNets have none); each gets the hint."""
    from autotune.workloads.batches import hinted

    module = torch.nn.Conv2d(3, 2, 3, bias=bias) if kind == "conv" else torch.nn.Linear(8, 2, bias=bias)
    with pytest.raises(RuntimeError) as raised:
        module(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert hinted(f"RuntimeError: {raised.value}").endswith("the inputs are float64 (NumPy's default dtype) and the model's weights "
                                                            "float32: make the items float32 (torch.as_tensor(x, dtype=torch.float32), "
                                                            "or x.astype(np.float32))"), raised.value
    assert "float64" not in hinted("RuntimeError: expected scalar type Float but found Double")  # the reverse: a float64 model


def test_items_of_python_lists_get_the_hint_that_default_collate_splits_them() -> None:
    """An item ``([0.1, ...], label)``: default_collate made 16 tensors of the batch's first values, and the model's
    TypeError (`must be Tensor, not list`) came without a word on why."""
    from torch.utils.data import default_collate

    from autotune.workloads.batches import hinted

    inputs, _ = default_collate([([0.5] * 16, 1), ([0.25] * 16, 0)])
    with pytest.raises(TypeError) as raised:
        torch.nn.Linear(16, 2)(inputs)
    assert hinted(f"TypeError: {raised.value}").endswith(
        "default_collate turns an item's Python list of numbers into one tensor per position, not one tensor (unless the Task's "
        "collate_fn stacks it): return a tensor from __getitem__ (torch.tensor(values, dtype=torch.float32))"), raised.value
    # A model's tuple output handed on (an LSTM's (output, state)) is no item's list: no hint that sends the user there.
    assert hinted("TypeError: linear(): argument 'input' (position 1) must be Tensor, not tuple").endswith("not tuple")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_float32_inputs_to_a_16_bit_layer_get_the_hint_whatever_torch_says(kind: str, bias: bool, dtype: torch.dtype) -> None:
    """A probe's bfloat16 model given float32 items read torch's words alone; a model built on the meta device too."""
    from autotune.workloads.batches import hinted

    module = (torch.nn.Conv2d(3, 2, 3, bias=bias) if kind == "conv" else torch.nn.Linear(8, 2, bias=bias)).to(dtype)
    with pytest.raises(RuntimeError) as raised:
        module(torch.randn(2, 3, 8, 8))
    assert hinted(f"RuntimeError: {raised.value}").endswith("autocast, which the search tries as amp=bf16, computes in 16 bits"), raised.value
    with pytest.raises(RuntimeError) as meta:
        torch.nn.Linear(8, 2, device="meta")(torch.randn(2, 8))
    assert hinted(f"RuntimeError: {meta.value}").endswith("(model.to_empty(device='cpu'), then initialise or load the weights)")


def test_a_stream_that_augments_randomly_is_still_caught_yielding_whole_from_every_worker() -> None:
    """Random noise before each yield made every worker's copy differ: the probing workers are seeded alike,
    so the copies are equal again, while a stream that splits itself still yields different items."""
    assert _workload("augmented_iterable").unsharded
    assert not _workload("augmented_sharded_iterable").unsharded
    # Samples generated at random differ between workers in training (seeded apart): not copies, whatever the seeding.
    assert not _workload("random_iterable").unsharded


def test_a_stream_of_random_samples_with_few_labels_is_not_taken_for_copies_by_chance() -> None:
    """Labels drawn from two classes agree between two workers seeded apart by chance: with 2 items compared per worker
    (the check's first version) 1 stream in 4 passed for a copy, and got one loader worker. The seeds below (the loader
    seeds its workers from torch's generator) are three where it did; each item compared more halves the chance."""
    from autotune.workloads.streams import workers_repeat_items

    class Coin(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            while True:
                yield torch.randn(4), int(torch.randint(0, 2, ()))

    for seed in (2, 4, 5):
        torch.manual_seed(seed)
        assert not workers_repeat_items(Coin()), seed


def test_unpicklable_dataset_is_fine_without_workers_or_with_workers_that_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.workloads import tasks

    assert _workload("unpicklable", workers=False).images == 40
    monkeypatch.setattr(tasks, "worker_start_method", lambda: "fork")
    assert _workload("unpicklable").images == 40  # forked workers inherit it: nothing is pickled


@pytest.mark.slow
def test_a_workload_module_that_sets_spawn_has_its_unpicklable_collate_refused_before_any_trial(tmp_path: Path) -> None:
    """A module that calls set_start_method("spawn", force=True) as it is imported (common in CUDA code) starts the
    trials' loader workers by spawn too; the check read the platform's default (fork) and passed, and the calibration's
    runs with workers failed on the pickling instead of the one line naming the fix."""
    import subprocess

    (tmp_path / "spawned.py").write_text(
        "import multiprocessing\nimport torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
        "import autotune\n\nmultiprocessing.set_start_method('spawn', force=True)\n\n\n"
        "def make():\n    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))\n"
        "    return autotune.Task(nn.Linear(8, 2), data, collate_fn=lambda items: torch.utils.data.default_collate(items))\n")
    ran = subprocess.run([sys.executable, "-m", "autotune", "search", "--workload", "spawned:make", "--device", "cpu", "--trials", "2",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode != 0 and "error: the workload's collate_fn (function) cannot be pickled for DataLoader workers" in ran.stderr, ran.stderr
    assert not (tmp_path / "out" / "study.db").exists()


def test_a_trial_whose_stream_holds_no_full_optimizer_step_per_pass_fails_as_train_py_would() -> None:
    from autotune.workloads.pipeline import endless_batches

    class Five(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(torch.arange(5.0))

    def take(setup: autotune.TrainSetup, count: int) -> list[Any]:
        batches = endless_batches(setup, Five(), collate_fn=None, seed=0)
        return [next(batches) for _ in range(count)]

    assert len(take(autotune.TrainSetup(batch_size=2, accumulation_steps=2), 6)) == 6  # 2 batches a pass: a step each, looped
    with pytest.raises(RuntimeError, match=re.escape("no full optimizer step of 2 x 4 in one pass (2 batches of 2)")):
        take(autotune.TrainSetup(batch_size=2, accumulation_steps=4), 3)
    # The calibration's halving reads "no full batch"; `autotune trial` of a stream too short for its batch says what fits.
    # (The stream is not read again to count it: a second pass may block, a queue filled once.)
    with pytest.raises(RuntimeError, match=re.escape("the dataset yields no full batch of 8 samples (a pass holds fewer): pass a smaller "
                                                     "batch size (--batch-size; in Python, setup=autotune.TrainSetup(batch_size=...))")):
        take(autotune.TrainSetup(batch_size=8), 1)


def test_a_huge_map_style_dataset_is_read_at_random_indices_without_permuting_all_of_it() -> None:
    """A dataset of a trillion items (a window at every position of a token corpus) was read through a permutation of
    all its indices: 8 TB asked for at the first batch, and every trial and loader calibration ended oom."""
    from autotune.workloads.pipeline import endless_batches

    class Windows(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 10**12

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            return torch.full((4,), float(index)), index % 2

    batches = endless_batches(autotune.TrainSetup(batch_size=8), Windows(), collate_fn=None, seed=0)
    firsts = [next(batches)[0][:, 0] for _ in range(3)]
    indices = torch.cat(firsts)
    assert len(indices) == 24 and len(set(indices.tolist())) == 24 and bool((indices >= 0).all())
    from autotune.workloads.data import PERMUTED_ITEMS, InfiniteSampler

    small = InfiniteSampler(PERMUTED_ITEMS // 2**10, seed=1)  # a dataset of up to PERMUTED_ITEMS: epoch after epoch, each a permutation
    stream = iter(small)
    for _ in range(2):
        assert sorted(next(stream) for _ in range(small.size)) == list(range(small.size))


def test_a_stream_used_up_by_its_first_pass_is_named_not_taken_for_one_too_short_for_the_batch() -> None:
    """A one-shot stream (an iterator made in __init__) yields nothing on its second pass: the trial and the memory
    pre-pass say so, where they said "no full batch" (which the calibration halved to batch 1) or "yields no items"."""
    from task_factories import OneShotStream

    from autotune.workloads.data import BadData
    from autotune.workloads.pipeline import REITERATED, endless_batches, open_pipeline

    batches = endless_batches(autotune.TrainSetup(batch_size=4), OneShotStream(), collate_fn=None, seed=0)
    assert len([next(batches) for _ in range(6)]) == 6  # the first pass: 24 items
    with pytest.raises(RuntimeError) as raised:
        next(batches)
    assert str(raised.value) == REITERATED and "no full batch" not in REITERATED and "iterated a second time" in REITERATED
    with pytest.raises(BadData, match="iterated a second time"):  # the pre-pass stops: no batch size would help
        open_pipeline(_workload("one_shot_iterable")).example_batch(32)


def test_a_stream_that_every_worker_yields_whole_gets_one_worker_at_most() -> None:
    """Two real loader workers of an IterableDataset that ignores get_worker_info() yield the same items:
    more workers would count copies as speed, so the space, the calibration and --set stop at one."""
    from test_calibrate import FakeRunner

    copies, sharded = _workload("iterable"), _workload("sharded_iterable")
    assert copies.unsharded and not sharded.unsharded
    assert not _workload("iterable", workers=False).unsharded  # no workers, nothing to check
    assert Workload.from_dict(json.loads(json.dumps(copies.to_dict()))) == copies

    runner, lines = FakeRunner(), []
    calibration = calibrate(copies, CPU, usable_cores=4, available_bytes=2**34, max_memory=None, trial_seconds=3.0,
                            bf16_ok=False, runner=runner, log=lines.append)
    assert calibration.max_workers == 1
    assert {s.num_workers for mode, s in runner.calls if mode == "loader"} == {0, 1}
    assert any("does not split its stream" in line for line in lines)
    space = build_space(device=CPU, calibration=calibration, usable_cores=4, effective_batch=None, constraints={},
                        workload=copies, image_input=False)
    assert space.values["num_workers"] == (0, 1)
    wide = {"num_workers": parse_constraint("num_workers=0..4")}
    assert build_space(device=CPU, calibration=calibration, usable_cores=4, effective_batch=None, constraints=wide,
                       workload=copies, image_input=False).values["num_workers"] == (0, 1)
    with pytest.raises(UsageError, match="every worker would yield every item; use 0 or 1"):
        build_space(device=CPU, calibration=calibration, usable_cores=4, effective_batch=None,
                    constraints={"num_workers": parse_constraint("num_workers=2")}, workload=copies, image_input=False)
    refused = cli.invoke(app, ["trial", "--workload", "task_factories:iterable", "--workers", "2", "--device", "cpu"])
    assert refused.exit_code == 2 and "--workers 2: this IterableDataset" in refused.output and "every worker would yield every item" in refused.output
    other = calibrate(sharded, CPU, usable_cores=4, available_bytes=2**34, max_memory=None, trial_seconds=3.0,
                      bf16_ok=False, runner=FakeRunner())
    assert other.max_workers > 1


@pytest.mark.parametrize("extra", [["--lr", "0.5"], ["--synthetic-images", "64"], ["--cache-dir", "/tmp/elsewhere"]])
def test_shorthand_only_options_are_refused_next_to_a_workload(extra: list[str], tmp_path) -> None:
    from autotune.cli import app

    refused = CliRunner().invoke(app, ["search", "--workload", "task_factories:good", "--device", "cpu", "--out", str(tmp_path / "o"),
                                       *extra])
    owns = "learning rate" if extra[0] == "--lr" else "data"  # a trial has no --lr: "learning rate and data" named one it lacks
    assert refused.exit_code == 2 and f"{extra[0]}: for the classifier shorthand only; a workload's Task sets its own {owns}\n" in refused.output
    assert not (tmp_path / "o").exists()


def test_a_factory_slower_than_the_runs_timeout_is_refused_before_any_run(tmp_path) -> None:
    """A factory that loads a corpus for longer than a run's timeout made all five runs of the memory pre-pass time out
    (10 minutes at the default timeout), then blamed a busy machine: every run builds the Task again within it."""
    from autotune.cli import app

    refused = CliRunner().invoke(app, ["search", "--workload", "task_factories:slow_to_build", "--device", "cpu", "--timeout", "4",
                                       "--trial-seconds", "1", "--out", str(tmp_path / "o")])
    assert refused.exit_code == 1, refused.output
    assert re.fullmatch(r"(?:warning: workload task_factories:slow_to_build: its factory has not returned after 2 s in this check; .*\n)?"
                        r"error: workload task_factories:slow_to_build: its factory took \d+\.\d s here, and every calibration run and "
                        r"trial calls it again within a timeout of 4 s \(--timeout\): pass --timeout \d+0 or more, or make the "
                        r"factory cheaper \(prepare the data once, into files its dataset reads\)\n", refused.output), refused.output
    assert not (tmp_path / "o").exists()


def test_a_factory_that_has_not_returned_is_said_while_it_runs() -> None:
    """A factory that hangs (a lock, the network) in the parent's check kept `autotune trial --timeout 10` silent until
    it was killed: --timeout covers the runs, not that call. Said once it is late; a quick one is not said."""
    import threading

    from autotune.records import TrialOptions
    from autotune.workloads.factory_time import watched

    said: list[str] = []
    late = threading.Event()

    def notice(line: str) -> None:
        said.append(line)
        late.set()

    options = TrialOptions(trial_seconds=1.0, timeout_s=0.4)  # said after half of it
    assert watched(lambda: late.wait(120), "m:f", options, notice) is True  # it returns only once it was said
    assert said == ["warning: workload m:f: its factory has not returned after 0 s in this check; every calibration run and "
                    "trial runs it again within its timeout (one that waits on a lock or the network hangs here: Ctrl-C stops)"]
    assert watched(lambda: "task", "m:f", options, notice) == "task"
    time.sleep(0.5)
    assert len(said) == 1  # a call that returned in time: its notice was called off


def test_a_slow_factory_that_fits_is_said_and_the_default_timeout_named() -> None:
    from autotune.errors import WorkloadError
    from autotune.records import TrialOptions
    from autotune.workloads.factory_time import check_factory_time

    said: list[str] = []
    check_factory_time("m:f", 12.0, TrialOptions(trial_seconds=5.0), said.append)  # the default timeout, 120 s: it fits
    assert said == ["the workload's factory took 12.0 s here: every calibration run and trial calls it again, on top of its 5 "
                    "measured seconds (prepare the data once, into files its dataset reads, to search faster)"]
    check_factory_time("m:f", 4.0, TrialOptions(trial_seconds=5.0), said.append)  # less than a trial: not worth a line
    assert len(said) == 1
    with pytest.raises(WorkloadError, match=r"within a timeout of 120 s \(the default, 90 s \+ 6 x --trial-seconds 5\): pass "
                                            r"--timeout 260 or more"):
        check_factory_time("m:f", 70.0, TrialOptions(trial_seconds=5.0), said.append)
    # Slow on its first call only (a download, a cache written once): the runs' calls are timed by the second.
    check_factory_time("m:f", 70.0, TrialOptions(trial_seconds=5.0), said.append, again=lambda: 2.0)
    assert said[-1] == ("the workload's factory took 70.0 s on its first call and 2.0 s on the next (a download or a cache, say): "
                        "the runs' calls are the later ones")
    with pytest.raises(WorkloadError, match=r"its factory took 68.0 s here"):
        check_factory_time("m:f", 70.0, TrialOptions(trial_seconds=5.0), said.append, again=lambda: 68.0)


def test_debug_shows_the_users_own_traceback_under_the_one_line_error() -> None:
    import traceback

    from autotune.cli import app

    plain = CliRunner().invoke(app, ["trial", "--workload", "task_factories:forward_fails", "--device", "cpu"])
    assert plain.exit_code == 1 and "Traceback" not in plain.output
    debug = CliRunner().invoke(app, ["--debug", "trial", "--workload", "task_factories:forward_fails", "--device", "cpu"])
    shown = "".join(traceback.format_exception(debug.exception))
    assert "mat1 and mat2 shapes cannot be multiplied" in shown and "During handling of the above exception" in shown


def test_a_trial_of_a_task_runs_at_its_batch_size_unless_another_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.runner

    batches: list[int] = []

    def record(setup: autotune.TrainSetup, workload: Workload, options: TrialOptions) -> TrialResult:
        batches.append(setup.batch_size)
        return TrialResult(status="ok", samples_per_s=100.0)

    monkeypatch.setattr(autotune.runner, "prestart", lambda: None)
    monkeypatch.setattr(autotune.runner, "run_trial", record)
    for flags in ([], ["--batch-size", "8"], ["--set", "batch_size=4"]):
        result = cli.invoke(app, ["trial", "--workload", "task_factories:good", "--device", "cpu", *flags])
        assert result.exit_code == 0 and f"bs={batches[-1]} " in result.output, result.output
    autotune.trial("task_factories:good", device="cpu")
    autotune.trial("task_factories:good", device="cpu", setup=autotune.TrainSetup(batch_size=32))
    assert batches == [16, 8, 4, 16, 32]  # the good Task's batch_size is 16
    autotune.trial("task_factories:few", device="cpu")
    assert batches[-1] == 5  # all of fewer samples, as a search's defaults take them
    # What the search never runs and train.py refuses is refused here too, not measured from an endless sampler.
    # Named as the TrainSetup's knobs, which the caller set.
    for setup, said in ((autotune.TrainSetup(batch_size=8), "batch_size=8 x accumulation_steps=1 = 8 exceeds the 5 training samples"),
                        (autotune.TrainSetup(batch_size=2, num_workers=1, prefetch_factor=4),
                         "the loader queue (num_workers=1 x prefetch_factor=4 x batch_size=2 = 8 samples)")):
        with pytest.raises(UsageError, match=re.escape(said)):
            autotune.trial("task_factories:few", device="cpu", setup=setup)
    assert batches[-1] == 5
    # Per rank, as the search checks: 2 ranks read 2 of the 5 samples each. A compute-only trial reads no data.
    with pytest.raises(UsageError, match=re.escape("batch_size=3 x accumulation_steps=1 = 3 exceeds the 2 training samples")):
        autotune.trial("task_factories:few", device="cpu", setup=autotune.TrainSetup(batch_size=3), nproc_per_node=2)
    autotune.trial("task_factories:few", device="cpu", setup=autotune.TrainSetup(batch_size=2, num_workers=1, prefetch_factor=4),
                   mode="compute")
    assert batches[-1] == 2
    autotune.trial("task_factories:few", device="cpu", nproc_per_node=2)  # the Task's batch capped at one rank's 2 samples
    assert batches[-1] == 2


def test_json_stdout_holds_the_object_alone_when_the_workload_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.runner

    monkeypatch.setattr(autotune.runner, "prestart", lambda: None)
    monkeypatch.setattr(autotune.runner, "run_trial", lambda setup, workload, options: TrialResult(status="ok", samples_per_s=9.0))
    for args in ([], ["--channels-last"]):  # measured, and refused after the factory ran: either way one object on stdout
        result = cli.invoke(app, ["trial", "--workload", "task_factories:chatty", "--device", "cpu", "--json", *args])
        said = json.loads(result.stdout)
        assert said["samples_per_s"] == (9.0 if not args else None), result.output
        assert "loading the data" in result.stderr  # the factory's print is kept, on stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "no_such_module:make_task"], "cannot import 'no_such_module'"),
        (["--workload", "task_factories:empty"], "is empty"),
        (["--workload", "task_factories:good", "--data", "somewhere"], "not both"),
        (["--workload", "task_factories:good", "--model", "resnet18"], "not both"),
        (["--workload", "task_factories:good", "--image-size", "64"], "not both"),
        (["--workload", "task_factories:good", "--set", "channels_last=true"], "no 4-D floating tensor"),
    ],
)
def test_cli_search_with_a_bad_workload_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    result = cli.invoke(app, ["search", "--trials", "1", "--device", "cpu", "--out", str(out), *args])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code in (1, 2) and len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert message in lines[0]
    assert not out.exists() or not any(out.iterdir())


# ------------------------------------------------------------------ batches
def test_batches_of_any_shape_move_and_count() -> None:
    Pair = collections.namedtuple("Pair", "image label")
    batch = {"ids": torch.zeros(4, 7, dtype=torch.long), "nested": [Pair(torch.zeros(4, 3, 8, 8), torch.zeros(4))], "name": "x"}
    moved = to_device(batch, "cpu", channels_last=True)
    assert isinstance(moved["nested"][0], Pair) and moved["name"] == "x"
    assert moved["nested"][0].image.is_contiguous(memory_format=torch.channels_last)
    assert moved["ids"].is_contiguous()
    assert first_dim(batch) == 4 and has_image_tensor(batch) and not has_image_tensor({"ids": batch["ids"]})
    assert describe_batch((torch.zeros(2, 3), 1)) == "(Tensor[2, 3] float32, int)"
    with pytest.raises(WorkloadError, match="batch_size_of"):
        first_dim({"text": "no tensors"})


def test_dataclass_batches_move_and_count_like_dicts() -> None:
    @dataclasses.dataclass(frozen=True)
    class Batch:
        image: torch.Tensor
        label: torch.Tensor
        name: str = "b"
        extra: list = dataclasses.field(default_factory=list, init=False)  # type: ignore[type-arg]

    batch = Batch(torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
    object.__setattr__(batch, "extra", [torch.ones(4)])
    moved = to_device(batch, "meta", channels_last=True)  # every tensor moved, the batch's type and other fields kept
    assert isinstance(moved, Batch) and moved.name == "b" and batch.image.device.type == "cpu"
    assert {t.device.type for t in (moved.image, moved.label, moved.extra[0])} == {"meta"}
    assert moved.image.is_contiguous(memory_format=torch.channels_last)
    assert first_dim(batch) == 4 and has_image_tensor(batch)
    assert describe_batch(batch) == "Batch(image: Tensor[4, 3, 8, 8] float32, label: Tensor[4] int64, name: str, extra: [Tensor[4] float32])"
    work = _workload("dataclass_batches")  # checked and counted without batch_size_of, as trials count it
    assert work.task == "task_factories:dataclass_batches" and not work.image_input


class MovesItself:
    """A batch class of the kind a collate_fn returns (a graph library's too): it moves itself by PyTorch's ``to``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def to(self, device: object) -> MovesItself:
        return MovesItself(self.x.to(device), self.y.to(device))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.y)


def test_a_batch_object_with_its_own_to_method_moves_itself() -> None:
    """A ``Batch`` with ``to(device)`` (tensors as attributes) stayed where it was, so on a GPU the model met CPU
    tensors; its count said the batch held no tensors. It moves itself now, alone or nested; the count names what
    autotune looks into and the fix."""
    batch = MovesItself(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    moved = to_device(batch, "meta")
    assert isinstance(moved, MovesItself) and {moved.x.device.type, moved.y.device.type} == {"meta"}
    nested = to_device({"graph": batch, "kind": MovesItself, "ids": ["a", "b"], "to": 3}, "meta")
    assert nested["graph"].x.device.type == "meta" and nested["kind"] is MovesItself and nested["ids"] == ["a", "b"]
    # PyTorch's own: a PackedSequence (a namedtuple whose to() keeps batch_sizes on the CPU) failed field by field.
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.zeros(3, 2, 4), torch.tensor([3, 2]))
    moved_packed = to_device({"x": packed}, "meta")["x"]
    assert moved_packed.data.device.type == "meta" and moved_packed.batch_sizes.device.type == "cpu"
    with pytest.raises(WorkloadError, match=r"^cannot count the samples of a MovesItself batch: it holds no tensor where autotune "
                                            r"looks \(tensors, tuples, lists, dicts and dataclasses, nested\); give the Task a "
                                            r"batch_size_of= \(a function of the batch\)$"):
        first_dim(batch)


# ------------------------------------------------------------ search pieces
def _calibration(max_batch: int = 64) -> autotune.records.Calibration:  # type: ignore[name-defined]
    from autotune.records import Calibration

    return Calibration(None, max_batch, (), 32, {}, 100.0, (), 2)


def test_a_dataset_with_its_own_batched_read_is_checked_and_trained_as_a_dataloader_reads_it() -> None:
    """A DataLoader hands what ``__getitems__`` returns (here one dict) to the collate_fn and never calls ``__getitem__``;
    the check read the items one by one and refused the Task ("list indices must be integers or slices, not str")."""
    from autotune.runner import entry

    workload = _workload("batched_reads")
    assert workload.fixed_shapes
    assert _workload("batched_reads_lazy").parameters == 8 * 2 + 2  # the lazy module shaped from the batched read
    for workers in (0, 2):
        setup = TrainSetup(batch_size=8, num_workers=workers)
        request = {"setup": setup.to_dict(), "workload": workload.to_dict(),
                   "options": dataclasses.asdict(TrialOptions(trial_seconds=0.3, windows=2))}
        result = entry.execute(request, started=time.perf_counter(), send=lambda event: None)
        assert result.status == "ok", result.error
    request = {"setup": TrainSetup(batch_size=8).to_dict(), "workload": workload.to_dict(),  # compute mode's batch too
               "options": dataclasses.asdict(TrialOptions(trial_seconds=0.3, windows=2, mode="compute"))}
    assert entry.execute(request, started=time.perf_counter(), send=lambda event: None).status == "ok"


def test_lazy_modules_are_materialized_before_channels_last_and_the_optimizer() -> None:
    """nn.LazyConv2d's parameters have no shape until a forward: channels_last (and DDP) failed every such trial with
    'Attempted to use an uninitialized parameter', and so did the emitted train.py."""
    import task_factories
    from torch.nn.parameter import is_lazy

    from autotune.runner import entry

    for name in ("lazy_modules", "lazy_modules_stream"):
        task = getattr(task_factories, name)()
        model = task.build_model()
        assert model.training and not any(is_lazy(t) for t in [*model.parameters(), *model.buffers()]), name
    model = task_factories.lazy_modules().build_model()
    assert model[1].num_batches_tracked.item() == 0  # the shaping forward ran in eval mode: no statistics taken
    setup = TrainSetup(batch_size=4, channels_last=True, optimizer_impl="foreach")
    options = TrialOptions(trial_seconds=0.3, windows=2)
    request = {"setup": setup.to_dict(), "workload": _workload("lazy_modules").to_dict(), "options": dataclasses.asdict(options)}
    result = entry.execute(request, started=time.perf_counter(), send=lambda event: None)
    assert result.status == "ok", result.error


def test_space_offers_channels_last_only_for_image_batches_and_defaults_use_the_recipe_batch() -> None:
    space = build_space(device=CPU, calibration=_calibration(), usable_cores=2, effective_batch=None, constraints={}, image_input=False)
    assert space.values["channels_last"] == (False,)
    with pytest.raises(UsageError, match="no 4-D floating tensor"):
        build_space(device=CPU, calibration=_calibration(), usable_cores=2, effective_batch=None,
                    constraints={"channels_last": parse_constraint("channels_last=true")}, image_input=False)
    assert defaults_setup(None, batch=16).batch_size == 16
    assert defaults_setup(48, batch=16).effective_batch() == 48


def test_data_that_fails_to_load_without_workers_ends_the_calibration_in_one_line() -> None:
    """An item that raises past the first batches: every setup reads it, so no trial is spent on it."""

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        options = options or TrialOptions()
        if options.mode == "loader":
            return TrialResult(status="error", error="ValueError: corrupt record 250")
        return TrialResult(status="ok", samples_per_s=100.0, peak_memory_bytes=2**20 * (100 + setup.batch_size))

    with pytest.raises(WorkloadError, match=r"workload task_factories:good: loading the data fails \(loader alone, no workers, "
                                            r"batch \d+\): ValueError: corrupt record 250; fix the dataset"):
        calibrate(_workload("good"), CPU, usable_cores=2, available_bytes=2**34, max_memory=None, trial_seconds=1.0, bf16_ok=True,
                  runner=runner)


def test_loader_workers_that_always_fail_leave_the_search_with_none() -> None:
    messages: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        options = options or TrialOptions()
        if options.mode == "loader" and setup.num_workers > 0:
            return TrialResult(status="error", error="failed in a DataLoader worker, not in the training loop: OSError: x")
        return TrialResult(status="ok", samples_per_s=100.0, peak_memory_bytes=2**20 * (100 + setup.batch_size))

    result = calibrate(_workload("good"), CPU, usable_cores=2, available_bytes=2**34, max_memory=None,
                       trial_seconds=1.0, bf16_ok=True, log=messages.append, runner=runner)
    assert result.max_workers == 0
    assert any("loader workers fail (failed in a DataLoader worker" in m for m in messages)
    assert workers_broken([LoaderPoint(0, "ok", 1.0), LoaderPoint(1, "ok", 1.0)], None) is None


def test_a_worker_exception_is_reported_as_a_loader_failure() -> None:
    exc = ValueError("Caught OSError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  ...\nOSError: no db")
    result = classify(exc)
    assert result.status == "error" and result.error == "failed in a DataLoader worker, not in the training loop: OSError: no db"


def test_items_of_different_shapes_are_told_to_pad_in_a_collate_fn() -> None:
    from torch.utils.data import default_collate

    with pytest.raises(RuntimeError) as caught:
        default_collate([torch.zeros(3), torch.zeros(4)])
    for exc in (caught.value, ValueError(f"Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback:\n"
                                         f"RuntimeError: {caught.value}")):
        error = classify(exc).error or ""
        assert "stack expects each tensor to be equal size" in error and "that pads them" in error, error
    assert "collate_fn" not in (classify(RuntimeError("shape mismatch")).error or "")


class _SometimesNone(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Dict items whose "meta" is text in the first 4 and None after: the first batch of 6 collates, the second does not."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": torch.zeros(8), "y": index % 3, "meta": "note" if index < 4 else None}


def test_a_length_sorted_dataset_s_example_batch_spans_its_lengths() -> None:
    """The memory pre-pass and the compute-only ceiling run a batch of the Task's items: its first ones, which in a
    dataset sorted by length are its shortest (a probe's pre-pass measured 217 MiB where its trials peaked at 434-555
    MiB, and a compute-only ceiling 130x the trials' rate). Its items are spread from the first to the last."""
    from autotune.workloads.pipeline import TaskPipeline, spread_indices

    assert spread_indices(4, 80) == [0, 26, 52, 79] and spread_indices(3, 2) == [0, 1, 0] and spread_indices(1, 5) == [0]
    pipeline = TaskPipeline(_workload("length_sorted"))
    longest = max(len(tokens) for tokens, _ in pipeline.task.dataset)
    tokens, labels = pipeline.example_batch(4)
    assert tokens.shape == (longest, 4) and labels.shape == (4,)  # padded to the longest item, as the last batches are


def test_a_batch_that_cannot_be_collated_names_its_items_not_only_pytorch_s_type_error() -> None:
    """Items that collate only in some mixes passed the check of the first ones and stopped calibration with
    default_collate's TypeError, naming no key; in a loader worker the error stays itself."""
    from torch.utils.data import DataLoader

    from autotune.workloads.pipeline import NamedCollate, TaskPipeline

    collate = TaskPipeline(_workload("good")).collate_fn()
    assert isinstance(collate, NamedCollate) and collate([_SometimesNone()[i] for i in range(4)])["meta"] == ["note"] * 4
    loader = DataLoader(_SometimesNone(), batch_size=6, collate_fn=collate)
    with pytest.raises(WorkloadError, match=r"^batch item 0 \(\{x: Tensor\[8\] float32, y: int, meta: NoneType\}\) cannot be "
                                            r"collated: TypeError: default_collate: .* found <class 'NoneType'>; an item holds None, "
                                            r"which PyTorch's default collate cannot batch: .* keeps such fields in lists$"):
        list(loader)
    with pytest.raises(TypeError, match="found <class 'NoneType'>"):
        list(DataLoader(_SometimesNone(), batch_size=6, collate_fn=collate, num_workers=1))


def test_batch_norm_on_a_batch_of_one_is_told_the_batch_it_needs() -> None:
    """A Task whose recipe batch is 1 on a BatchNorm model: the defaults' trial fails with the fix named."""
    with pytest.raises(ValueError) as caught:
        torch.nn.BatchNorm1d(4).train()(torch.zeros(1, 4))
    error = classify(caught.value).error or ""
    assert error.startswith("ValueError: Expected more than 1 value per channel when training"), error
    assert error.endswith("a BatchNorm layer needs more than one value per channel to train on: a batch of 2 or more samples"), error


def fake_runner(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
    """Faster with larger batches and workers; the same deterministic values every call."""
    options = options or TrialOptions()
    rate = 50.0 * setup.batch_size ** 0.5 * (1 + 0.2 * setup.num_workers) * (2 if options.mode == "compute" else 1)
    return TrialResult(status="ok", samples_per_s=rate, samples_per_s_spread=0.0, windows=(rate,),
                       peak_memory_bytes=2**20 * (100 + setup.batch_size), data_wait_fraction=0.1)


def test_steps_a_short_stream_cannot_fill_use_no_trial_and_larger_ones_never_run(tmp_path: Path) -> None:
    """An IterableDataset of unknown length: a trial finds one pass too short for its step by running. That trial says
    nothing of the setup's speed, so it does not use up --trials (as a step larger than a sized dataset), and a later
    setup whose step is at least as large is recorded infeasible without running."""

    def stream_of_24(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        mode = (options or TrialOptions()).mode
        if mode == "loader" and setup.batch_size > 24:  # the calibration's probe bounds the batch: 16 at most
            return TrialResult(status="error", error="RuntimeError: the dataset yields no full batch")
        if mode == "train":
            batches = 24 // setup.batch_size
            if not batches:  # as autotune.workloads.pipeline.endless_batches says it
                return TrialResult(status="error", error=f"RuntimeError: the dataset yields no full batch of {setup.batch_size} samples")
            if batches < setup.accumulation_steps:  # what autotune.workloads.pipeline raises in such a trial
                return TrialResult(status="error", error=f"RuntimeError: the dataset yields no full optimizer step of "
                                                         f"{setup.batch_size} x {setup.accumulation_steps} in one pass ({batches} batches)")
        return fake_runner(setup, workload, options, on_window=on_window)

    config = SearchConfig(model="ignored", trials=8, device="cpu", trial_seconds=1.0, out=tmp_path / "out", sampler="random",
                          confirm_top=1, confirm_rounds=1, workload="task_factories:iterable")
    records = run_search(config, runner=stream_of_24).records
    from autotune.tuner.budget import counted_records

    starved = [r for r in records if "yields no full optimizer step" in (r.result.error or "")]
    skipped = [r for r in records if "one pass of the dataset holds fewer than" in (r.result.error or "")]
    assert starved and skipped, [(r.setup.describe(), r.result.error) for r in records]
    assert all(r.free for r in starved + skipped)  # neither uses up the budget (the trials that measured a speed do)
    assert counted_records(records) == len(records) - len(starved) - len(skipped) - sum(r.reused_from is not None for r in records)
    first = starved[0]  # once a step is found too long, no step as long runs again
    later = [r for r in records if r.number > first.number and r.reused_from is None and r not in skipped]
    assert all(r.setup.effective_batch() < first.setup.effective_batch() for r in later)
    assert all(r.setup.effective_batch() >= min(s.setup.effective_batch() for s in starved) for r in skipped)
    assert "one pass of the dataset holds fewer than" in (skipped[0].result.error or "")
    # The PyTorch defaults' batch (the Task's 32) is longer than the stream: they run at the largest batch it fills,
    # as a sized dataset smaller than the batch runs as one batch; at 32 their trial failed and no speedup was given.
    assert (records[0].setup.batch_size, records[0].result.status) == (16, "ok")


def test_a_task_search_with_a_fake_runner_writes_best_json_and_the_task_train_py(tmp_path: Path) -> None:
    config = SearchConfig(model="ignored", trials=4, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                          confirm_top=1, confirm_rounds=1, workload="task_factories:dict_batches")
    outcome = run_search(config, runner=fake_runner)
    best = outcome.best
    assert best is not None and best.workload.task == "task_factories:dict_batches"
    assert best.reference_batch == 4 and not any("synthetic" in n for n in best.notes)
    assert best.setup.channels_last is False  # not offered: the batches hold no image tensor
    # One step must fit in len(dataset) (20): a larger one is recorded as an error without running, and not counted.
    too_large = [r for r in outcome.records if r.setup.effective_batch() > 20]
    assert all(r.free and r.result.status == "error" and "exceeds the 20 training images" in (r.result.error or "") for r in too_large)
    assert sum(not r.free for r in outcome.records) == 4
    assert outcome.records[0].setup.batch_size == 4  # the defaults trial runs the recipe's batch
    script = (tmp_path / "out" / "train.py").read_text()
    assert "WORKLOAD = 'task_factories:dict_batches'" in script and "task.compute_loss(model, batch)" in script
    assert script == render_script(best)
    # A Task's data is its own: no image size in best.json, the script's header or --json (it would mean nothing).
    written = json.loads((tmp_path / "out" / "best.json").read_text())
    assert "image_size" not in written["workload"] and "image_size" not in outcome.to_dict()["best"]["workload"]
    assert "Tuned for: workload task_factories:dict_batches (autotune.Task) on cpu, 20 samples\n" in script and " px" not in script
    assert read_best(tmp_path / "out").workload == best.workload
    # Under DDP trials a Task's sample count is a rank's share: the header says so, as the search's line does.
    ddp = render_script(dataclasses.replace(best, world_size=2, workload=best.workload.rank_share(2)))
    assert "Tuned for: workload task_factories:dict_batches (autotune.Task) on cpu, 10 samples per rank\n" in ddp


def test_cli_trial_and_python_api_refuse_bad_workloads_before_running(tmp_path: Path) -> None:
    result = cli.invoke(app, ["trial", "--workload", "task_factories:not_a_task", "--device", "cpu"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and lines == ["error: workload task_factories:not_a_task returned int, not an autotune.Task"]
    with pytest.raises(WorkloadError, match="lambda"):
        autotune.search(workload=lambda: None, device="cpu", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="channels_last"):
        autotune.trial(workload="task_factories:good", device="cpu", setup=autotune.TrainSetup(channels_last=True))


def _checkpoint_lrs(output_dir: Path) -> list[float]:
    """Each param group's learning rate in the script's checkpoint."""
    return [g["lr"] for g in torch.load(output_dir / "checkpoint.pth", weights_only=True)["optimizer"]["param_groups"]]


def _task_script(tmp_path: Path, name: str, setup: autotune.TrainSetup) -> Path:
    from autotune.output.best import Best
    from autotune.output.emit import write_script

    work = _workload(name)
    best = Best(setup=setup, workload=work, samples_per_s=100.0, samples_per_s_spread=1.0, defaults_samples_per_s=None,
                speedup=None, peak_memory_bytes=None, effective_batch=setup.effective_batch(),
                reference_batch=work.reference_batch or 32, lr=work.lr)
    return write_script(best, tmp_path / "train.py")


#: The flags every run of a Task script below starts with: a line per step, the output in the script's ``out``.
_FLAGS = ["--print-freq", "1", "--output-dir", "out"]


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script as its own process (it finds the factory from its own directory)."""
    return subprocess.run([sys.executable, str(script), *_FLAGS, *args],
                          cwd=script.parent, capture_output=True, text=True, timeout=120)


def _run_here(script: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    """The script in this process (see :mod:`in_process`)."""
    return in_process.run_script(script, [*_FLAGS, *args], script.parent, capfd, monkeypatch)


def test_the_tuned_thread_count_stands_over_the_factory_s_own(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factory that calls torch.set_num_threads(1) ran every trial, and train.py, on one thread whatever their
    num_threads (the knob was applied before the factory ran): the search measured one setup under several names."""
    import task_factories

    from autotune.runner import entry

    before = torch.get_num_threads()
    try:
        setup = TrainSetup(batch_size=4, num_threads=2)
        request = {"setup": setup.to_dict(), "workload": _workload("sets_its_threads").to_dict(),
                   "options": dataclasses.asdict(TrialOptions(trial_seconds=0.3, windows=2))}
        task_factories.THREADS_SEEN.clear()
        result = entry.execute(request, started=time.perf_counter(), send=lambda event: None)
        assert result.status == "ok", result.error
        assert set(task_factories.THREADS_SEEN) == {2}
        script = _task_script(tmp_path, "sets_its_threads", setup)
        task_factories.THREADS_SEEN.clear()
        code, _, err = _run_here(script, capfd, monkeypatch, "--max-steps", "2")
        assert code == 0, err
        assert set(task_factories.THREADS_SEEN) == {2}
    finally:
        torch.set_num_threads(before)


def test_modules_the_factory_left_in_eval_mode_stay_so_in_the_check_the_trials_and_train_py(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fine-tuning recipe's frozen backbone in eval mode was switched to train mode by model.train() in every trial
    and in train.py: its BatchNorm's running statistics, the pretrained ones, drifted with every step."""
    import task_factories

    from autotune.runner import entry
    from autotune.workloads.modes import eval_modules, train_mode

    def statistics_kept(model: torch.nn.Module) -> bool:
        norm = model.backbone[1]
        return int(norm.num_batches_tracked) == 0 and not bool(norm.running_mean.any())

    task_factories.FINE_TUNED.clear()
    checked = build_task_workload("task_factories:frozen_backbone", device="cpu")  # the parent's check runs a step of the model
    # Its only BatchNorm stays in eval mode: no statistics per micro-batch to warn of (an accumulating winner's note).
    assert checked.batch_norm is False and build_task_workload("task_factories:good", device="cpu").batch_norm is False
    from autotune.workloads.modes import has_batch_norm

    assert has_batch_norm(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)))
    assert has_batch_norm(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval())  # trains whole
    setup = TrainSetup(batch_size=4)
    request = {"setup": setup.to_dict(), "workload": _workload("frozen_backbone").to_dict(),
               "options": dataclasses.asdict(TrialOptions(trial_seconds=0.3, windows=2))}
    result = entry.execute(request, started=time.perf_counter(), send=lambda event: None)
    assert result.status == "ok", result.error
    assert len(task_factories.FINE_TUNED) >= 2
    for model in task_factories.FINE_TUNED:
        assert statistics_kept(model) and not model.backbone.training and model.training and model.head[0].training
    code, _, err = _run_here(_task_script(tmp_path, "frozen_backbone", setup), capfd, monkeypatch, "--max-steps", "3", "--workers", "0")
    assert code == 0, err
    saved = torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)["model"]
    assert int(saved["backbone.1.num_batches_tracked"]) == 0 and not bool(saved["backbone.1.running_mean"].any())
    # A model wholly in eval mode (loaded for inference) trains whole; a module in training mode under one in eval
    # mode stays in training mode.
    nn = torch.nn
    inference = nn.Sequential(nn.BatchNorm1d(2), nn.Sequential(nn.Dropout(), nn.Linear(2, 2))).eval()
    train_mode(inference, eval_modules(inference))
    assert all(m.training for m in inference.modules())
    mixed = nn.Sequential(nn.BatchNorm1d(2), nn.Sequential(nn.Dropout(), nn.Linear(2, 2)))
    mixed[1].eval()
    mixed[1][0].train()
    train_mode(mixed, eval_modules(mixed))
    assert [m.training for m in mixed.modules()] == [True, True, False, True, False]


def test_the_task_script_reads_a_dataset_too_large_to_permute_at_random_indices(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's DistributedSampler permuted all 10**12 indices at its first batch (8 TB asked for): a traceback,
    where the search now measures such a dataset."""
    script = _task_script(tmp_path, "trillion_items", autotune.TrainSetup(batch_size=4))
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "2", "--workers", "0")
    assert code == 0 and "done: step 2" in out, err[-2000:]
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "3", "--workers", "0", "--resume")
    assert code == 0 and "done: step 3" in out, err[-2000:]
    sampler_class = runpy_sampler(script)
    dataset = torch.utils.data.TensorDataset(torch.zeros(10))
    sampler_class.DRAWN_ABOVE = 4  # a small dataset read the same way: the two ranks' indices, epoch by epoch
    ranks = [sampler_class(dataset, num_replicas=2, rank=rank, seed=0) for rank in (0, 1)]
    epochs = [[list(itertools.islice(sampler.shard(epoch), 5)) for sampler in ranks] for epoch in (0, 1)]
    assert all(0 <= i < 10 for epoch in epochs for shard in epoch for i in shard) and epochs[0] != epochs[1]
    assert [list(itertools.islice(ranks[0].shard(0), 5))] == epochs[0][:1]  # the same epoch draws the same indices again


def runpy_sampler(script: Path) -> Any:
    """The emitted script's ResumableSampler class."""
    import runpy

    return runpy.run_path(str(script), run_name="emitted")["ResumableSampler"]


def test_the_script_s_epoch_order_is_the_distributed_sampler_s_held_as_a_tensor_not_a_list(tmp_path: Path) -> None:
    """Up to DRAWN_ABOVE items the script read the DistributedSampler, whose permutation is a Python list of every index
    (40 bytes each: 1.9 GiB at 50 million items, in every rank), while the search's trials drew indices at random
    above a million items and measured none of it. The order is the same (a resumed run goes on where it stopped)."""
    import tracemalloc

    sampler_class = runpy_sampler(_task_script(tmp_path, "good", autotune.TrainSetup(batch_size=4)))
    small = list(range(103))
    for world, rank, epoch in ((1, 0, 0), (2, 1, 3), (3, 2, 1)):
        reference = torch.utils.data.DistributedSampler(small, num_replicas=world, rank=rank, shuffle=True, seed=5, drop_last=True)
        reference.set_epoch(epoch)
        assert list(sampler_class(small, num_replicas=world, rank=rank, seed=5).shard(epoch)) == list(reference)

    class Sized:  # two million items, none read: only the order is drawn
        def __len__(self) -> int:
            return 2_000_000

    tracemalloc.start()
    try:
        first = list(itertools.islice(sampler_class(Sized(), num_replicas=1, rank=0, seed=0).shard(0), 10))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(set(first)) == 10 and peak < 20 * 2**20, peak  # the list of two million indices alone holds over 70 MiB


@pytest.mark.slow
def test_a_stream_whose_torchrun_shards_differ_in_length_ends_each_epoch_on_every_rank_at_the_shortest(tmp_path: Path) -> None:
    """Rank 1's shard ended after 6 batches, rank 0's after 12: rank 1's end of the epoch met rank 0's gradient
    all-reduce, gloo aborted ("collective mismatch") and rank 0 blamed another process, with no checkpoint written."""
    script = _task_script(tmp_path, "uneven_shards", autotune.TrainSetup(batch_size=4))
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
                          "--epochs", "2", "--workers", "0", "--print-freq", "1", "--output-dir", "out"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180)
    # Rank 1 aborted here now and then after "done" ("terminate called without an active exception"): see the test below.
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    for epoch in (0, 1):
        assert ran.stdout.count(f"note: epoch {epoch} ends here on every process: a process's shard of the IterableDataset ended "
                                "before the others'") == 1, ran.stdout
    assert "epoch 0 done at step 6" in ran.stdout and "epoch 1 done at step 12" in ran.stdout, ran.stdout
    assert torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)["step"] == 12


def test_a_process_of_a_torchrun_job_ends_after_its_exit_work_without_the_interpreter_s_teardown(tmp_path: Path) -> None:
    """DDP keeps its gloo group's worker threads alive past destroy_process_group (PyTorch 2.14), and one that released
    a finished collective while the interpreter tore down aborted the process (SIGABRT after "done: step 12" in the
    test above, 1 run in 73 on a loaded machine; docs/benchmarks.md): torchrun called the job failed. A
    process that joined a group ends through leave(): atexit's handlers run, the threads Python waits for are joined,
    the output is flushed, and the teardown (which a module-level finalizer stands for here) is skipped."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))
    program = f"""
import atexit, runpy, threading, time
leave = runpy.run_path({str(script)!r}, run_name="emitted")["leave"]
leave.__globals__["_group_joined"] = True  # as init_distributed sets it after init_process_group
atexit.register(lambda: open("atexit.txt", "w").write("ran"))
def late():
    time.sleep(0.5)
    open("thread.txt", "w").write("ran")
threading.Thread(target=late).start()
class Teardown:
    def __del__(self, open=open):  # open bound now: the teardown removes the builtins before this runs
        open("teardown.txt", "w").write("ran")
kept = Teardown()
print("the last line, unflushed", end="")
leave(3)
"""
    ran = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 3, ran.stderr[-3000:]
    assert ran.stdout == "the last line, unflushed"
    assert (tmp_path / "atexit.txt").read_text() == "ran" and (tmp_path / "thread.txt").read_text() == "ran"
    assert not (tmp_path / "teardown.txt").exists()


def test_the_task_script_logs_the_whole_job_s_samples_per_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun each process counts its own batches (a Task's may count differently per rank): the logged rate
    is their sum, as the classifier script's is, not rank 0's share."""
    import runpy

    meter_class = runpy.run_path(str(_task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))), run_name="emitted")["Meter"]
    script = meter_class.log.__globals__  # the script's own globals
    lines: list[str] = []
    monkeypatch.setitem(script, "log", lines.append)
    monkeypatch.setattr(script["dist"], "is_initialized", lambda: True)
    monkeypatch.setattr(script["dist"], "all_reduce", lambda tensor: tensor.mul_(2))  # two processes that counted alike
    monkeypatch.setattr(script["time"], "perf_counter", lambda: 100.0)  # the interval is 100 s, whatever the machine does
    meter = meter_class(torch.device("cpu"))
    meter.start, meter.samples = 0.0, 100_000  # 100,000 samples here over 100 s
    meter.log(5)
    assert lines == ["step 5 loss 0.0000 samples/s 2000.0"]  # one process alone: 1000.0


def test_the_task_script_refuses_a_bad_workload_or_checkpoint_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))
    for flags, message in (
        (["--workload", "no_such_module_xyz:make"], "error: --workload no_such_module_xyz:make: cannot find module no_such_module_xyz; run from"),
        (["--workload", "task_factories:nothing_here"], "error: --workload task_factories:nothing_here: task_factories has no function"),
        (["--workload", "task_factories:TASK"],
         "error: --workload task_factories:TASK: TASK is an object of type Task, not a function that returns one"),
        (["--workload", "task_factories:raises"], "error: --workload task_factories:raises failed: RuntimeError: no data mounted"),
        (["--output-dir", "/proc/autotune-x"], "error: --output-dir /proc/autotune-x: No such file or directory"),
    ):
        line, _ = in_process.refusal(script, [*_FLAGS, *flags], script.parent, capfd, monkeypatch)
        assert line.startswith(message), line
        assert not (tmp_path / "out").exists()
    # Recipes the search refuses stop the script in one line too, and no checkpoint of NaN weights is written.
    for flags, message in ((["--workload", "task_factories:non_scalar_loss"], "error: the Task's loss must be a scalar tensor, got shape (8,)"),
                           (["--workload", "task_factories:dict_loss"], "error: the Task's loss must be a scalar floating tensor, got dict"),
                           (["--workload", "task_factories:integer_loss"], "error: the Task's loss must be a scalar floating tensor, got torch.int64"),
                           (["--workload", "task_factories:detached_loss"], "error: the Task's loss does not require grad (detached"),
                           (["--workload", "task_factories:frozen_model"],
                            "error: the model has no trainable parameters (none requires grad): there is nothing to train"),
                           # The Task's own refusals, raised as its parts are built: one line too, not a traceback.
                           (["--workload", "task_factories:model_fails"], "error: Task model factory failed: RuntimeError: no weights mounted"),
                           (["--workload", "task_factories:not_an_optimizer"],
                            "error: Task optimizer factory returned str, not a torch.optim.Optimizer"),
                           (["--workload", "task_factories:nan_loss"], "error: the loss or the weights became NaN or infinite by step 1"),
                           # The last step's loss was finite, the step blew the weights up: still no checkpoint.
                           (["--workload", "task_factories:nan_weights", "--max-steps", "1"],
                            "error: the loss or the weights became NaN or infinite by step 1"),
                           # A running statistic (BatchNorm's) turned NaN: the checkpoint would be unusable too.
                           (["--workload", "task_factories:nan_buffer", "--max-steps", "1"],
                            "error: the loss or the weights became NaN or infinite by step 1")):
        line, _ = in_process.refusal(script, ["--print-freq", "1", "--output-dir", "bad", *flags], script.parent, capfd, monkeypatch)
        assert line.startswith(message), line
        assert not (tmp_path / "bad" / "checkpoint.pth").exists()
    # Under autocast the advice names float32 too (a helper's bf16 NaN was fixed by --amp off, and the line said "lower --lr").
    line, _ = in_process.refusal(script, ["--print-freq", "1", "--output-dir", "bad", "--workload", "task_factories:nan_loss"],
                                 script.parent, capfd, monkeypatch)
    assert line.endswith("by step 1; stopped without saving a checkpoint (lower --lr, or check the model and the data)"), line
    line, _ = in_process.refusal(script, ["--print-freq", "1", "--output-dir", "bad", "--workload", "task_factories:nan_loss",
                                          "--amp", "bf16"], script.parent, capfd, monkeypatch)
    assert line.endswith("(lower --lr, or train in float32 (--amp off: bf16 autocast may lose precision the model needs), or check "
                         "the model and the data)"), line
    # A buffer of -inf on purpose (an attention mask) is not a blown-up state: the script trains and saves.
    code, _, err = in_process.run_script(script, ["--print-freq", "1", "--output-dir", "masked", "--workload", "task_factories:inf_mask_buffer",
                                                  "--max-steps", "2"], script.parent, capfd, monkeypatch)
    assert code == 0 and (tmp_path / "masked" / "checkpoint.pth").exists(), err
    (tmp_path / "out").mkdir()
    state = {"model": {}, "optimizer": {}, "epoch": 0, "epoch_step": 1, "step": 1}
    torch.save({**state, "args": {"batch_size": 8, "lr_scaling": "linear"}}, tmp_path / "out" / "checkpoint.pth")
    code, out, err = _run_here(script, capfd, monkeypatch, "--resume", "--lr-scaling", "sqrt")
    assert code == 1 and "was written with --lr-scaling linear (now sqrt)" in err and "step 1 loss" not in out
    torch.save({**state, "args": {"batch_size": 8, "seed": 3}}, tmp_path / "out" / "checkpoint.pth")  # another shuffle
    code, out, err = _run_here(script, capfd, monkeypatch, "--resume")
    assert code == 1 and "was written with --seed 3 (now 0)" in err and "step 1 loss" not in out
    torch.save({**state, "args": {"batch_size": 8}}, tmp_path / "out" / "checkpoint.pth")  # another model's weights
    line, _ = in_process.refusal(script, ["--output-dir", "out", "--resume"], script.parent, capfd, monkeypatch)
    assert "does not fit this model or optimizer" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_the_task_script_says_bad_data_in_one_line_and_leaves_no_loader_files(
    tmp_path: Path, workers: int, request: pytest.FixtureRequest, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item that raises, a batch that cannot be collated, a stream that raises: one line naming it (a stream by how
    far its pass got), its whole traceback in a file the line names (before, the DataLoader's traceback of 35-40 lines
    through the script's own frames), and, with loader
    workers, no pymp-* folder left in the temporary directory (the exit now comes after the loader shut them down).
    Without workers the script runs in this process; with them, as its own (a process's pymp-* folder goes at its exit)."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))
    temp = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))  # short: a worker's socket path must fit in 107 bytes
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    worker = " (in a loader worker)" if workers else ""
    log = "; its traceback: out/error.log"
    for workload, flags, message in (
        ("corrupt_item", [], f"error: dataset[13] failed{worker}: ValueError: corrupt record 13; fix the item or the dataset's code, "
                             f"then rerun (--resume goes on from the last checkpoint){log}"),
        ("ragged", ["--batch-size", "4"], "error: batch items 0..3 cannot be collated together (item 0: (Tensor["),
        ("corrupt_stream", [], f"error: the dataset's stream failed {'in loader worker 1 of 2, at its item 7' if workers else 'at item 14'} "
                               "of this pass: ValueError: corrupt record 13; fix the item or the dataset's code"),
    ):
        args = ["--output-dir", "out", "--workload", f"task_factories:{workload}", "--workers", str(workers), "--max-steps", "30", *flags]
        if workers:
            result = subprocess.run([sys.executable, str(script), *args], cwd=script.parent, capture_output=True, text=True,
                                    timeout=120, env={**os.environ, "TMPDIR": str(temp)})
            code, err = result.returncode, result.stderr
        else:
            code, _, err = in_process.run_script(script, args, script.parent, capfd, monkeypatch)
        line = err.strip().splitlines()[-1]
        assert code == 1 and line.startswith(message) and "Traceback" not in err, err
        if workload == "ragged":
            assert line.endswith("items of one batch differ in shape: give the workload a collate_fn (autotune.Task(collate_fn=...)) "
                                 "that pads them, or that keeps them in lists where the model takes lists (a torchvision "
                                 f"detector's images and targets: lambda items: tuple(zip(*items))){log}"), line
        written = (tmp_path / "out" / "error.log").read_text()  # the whole traceback, the worker's too, where the line says
        assert "Traceback" in written and ("cannot be collated" if workload == "ragged" else "corrupt record 13") in written
        assert not list(temp.glob("pymp-*"))


def test_an_item_that_fails_mid_run_keeps_the_task_script_s_steps_before_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item that raised mid-epoch ended the Task script without a checkpoint: the steps since the last one (with
    --checkpoint-every 0, the epoch's end) were lost, though the line said `--resume goes on from the last checkpoint`
    (the classifier script keeps them). The checkpoint of the last finished step is written, and --resume, once the
    item is fixed, goes on from it."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))
    marker = tmp_path / "corrupt"
    marker.touch()
    run = ["--workload", "task_factories:corrupt_in_the_second_epoch", "--workers", "0", "--epochs", "2", "--checkpoint-every", "0"]
    monkeypatch.setenv("TASK_FACTORIES_CORRUPT", str(marker))
    code, out, err = _run_here(script, capfd, monkeypatch, *run)
    assert code == 1 and "corrupt record" in err.strip().splitlines()[-1], err
    step = int(re.search(r"stopped by the data after step (\d+); checkpoint in ", out).group(1))  # type: ignore[union-attr]
    assert step == 7 and torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)["step"] == step  # 40 items / 8: 5 an epoch
    marker.unlink()
    code, out, err = _run_here(script, capfd, monkeypatch, *run, "--resume")
    assert code == 0 and f"at epoch 1 step {step}" in out and "done: step 10" in out, out + err
    # Met at the second epoch's first read: no step since the epoch's checkpoint, which stands (not written again under
    # a new id, which would make a --val-data run evaluate that epoch once more).
    marker.touch()
    (tmp_path / "out" / "checkpoint.pth").unlink()
    monkeypatch.setenv("TASK_FACTORIES_CORRUPT_READ", "41")
    code, out, err = _run_here(script, capfd, monkeypatch, *run)
    assert code == 1 and "stopped by the data" not in out, out + err
    assert torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)["step"] == 5


@pytest.mark.slow
def test_under_torchrun_only_the_rank_whose_stream_failed_writes_the_checkpoint(tmp_path: Path) -> None:
    """An iterable dataset under torchrun: rank 1's stream raised, and rank 0, whose collective (the epoch's even end)
    failed as rank 1 ended, also wrote the checkpoint and said `stopped by the data`, beside its own line that another
    process of the job ended. The rank that met the data writes it, alone."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=4))
    marker = tmp_path / "corrupt"
    marker.touch()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), "--output-dir", "out",
         "--workload", "task_factories:rank_stream", "--workers", "0", "--epochs", "3", "--checkpoint-every", "0", "--print-freq", "1"],
        cwd=script.parent, capture_output=True, text=True, timeout=240, env={**os.environ, "TASK_FACTORIES_CORRUPT": str(marker)})
    assert proc.returncode != 0 and "error: rank 1: the dataset's stream failed" in proc.stderr, proc.stderr[-3000:]
    said = re.findall(r"rank (\d): stopped by the data after step (\d+)", proc.stdout)
    assert [rank for rank, _ in said] == ["1"], proc.stdout
    assert torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)["step"] == int(said[0][1]) > 0
    assert not list((tmp_path / "out").glob("checkpoint.pth.tmp*"))


@pytest.mark.slow
@pytest.mark.parametrize("filled", [False, True])
def test_the_task_script_on_a_real_full_dev_shm_says_so_not_that_the_batch_cannot_be_collated(tmp_path: Path, filled: bool) -> None:
    """With loader workers PyTorch's default collate allocates the batch in /dev/shm: a 64 KiB tmpfs (in a private
    mount namespace, as a container's may be) cannot hold it. The line names /dev/shm; before, the script's collate
    wrapper took the allocation's RuntimeError for items that cannot be collated together. Filled to its last byte, the
    workers' queue lock fails first (OSError ENOSPC), which ended in a traceback."""
    script = _task_script(tmp_path, "large_items", autotune.TrainSetup(batch_size=16))
    fill = " && { dd if=/dev/zero of=/dev/shm/fill bs=4k 2>/dev/null; true; }" if filled else ""
    mount = "mount --make-rprivate / && mount -t tmpfs -o size=64k tmpfs /dev/shm" + fill + " && exec \"$@\""
    allowed = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", "true"], capture_output=True, timeout=60, check=False)
    if allowed.returncode != 0:
        pytest.skip(f"this process may not mount a private /dev/shm: {allowed.stderr.decode(errors='replace').strip()}")
    run = [sys.executable, str(script), "--output-dir", "out", "--workers", "1", "--max-steps", "3"]
    then_list = mount.replace(' && exec "$@"', ' && { "$@"; code=$?; ls -A /dev/shm; exit $code; }')
    result = subprocess.run(["unshare", "-m", "sh", "-c", then_list, "sh", *run], cwd=script.parent, capture_output=True,
                            text=True, timeout=300)
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    said = "as they started (/dev/shm holds 64 KiB, 0 KiB free): [Errno 28]" if filled else "(/dev/shm holds 64 KiB, "
    assert line.startswith(f"error: the loader's workers ran out of shared memory {said}"), line
    assert [name for name in result.stdout.split() if name.startswith("torch_")] == [], result.stdout  # none left there


def test_the_task_script_without_autotune_installed_says_so_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script needs autotune only through the factory's module: where it is not installed, the factory's import
    fails in one line naming the module, as for any other import the factory lacks."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))
    (tmp_path / f"needs_autotune_{tmp_path.name}.py").write_text("import autotune\n\ndef make():\n    return None\n")
    monkeypatch.setitem(sys.modules, "autotune", None)  # import autotune raises ImportError, as where it is not installed
    line, _ = in_process.refusal(script, ["--workload", f"needs_autotune_{tmp_path.name}:make"], tmp_path, capfd, monkeypatch)
    name = f"needs_autotune_{tmp_path.name}"
    assert line.startswith(f"error: --workload {name}:make: importing {name} failed: "), line
    assert "autotune" in line.removeprefix(f"error: --workload {name}:make: importing {name}") and line.endswith("(install it)"), line


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("import no_such_dependency_xyz\n", "importing {m} failed: No module named 'no_such_dependency_xyz' (install it)"),
        ("def make(:\n    pass\n", "importing {m} failed: SyntaxError: "),
        ("x = 1 / 0\n", "importing {m} failed: ZeroDivisionError: division by zero"),
    ],
)
def test_the_task_script_refuses_a_workload_module_that_fails_to_import_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, code: str, message: str
) -> None:
    """The module is found but its own import fails: the line names why, not 'run from the directory that holds it'
    (a dependency it lacks) nor a traceback (its code raised, a syntax error)."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))
    module = f"broken_{tmp_path.name}"
    (tmp_path / f"{module}.py").write_text(code)
    line, _ = in_process.refusal(script, ["--workload", f"{module}:make"], tmp_path, capfd, monkeypatch)
    assert line.startswith(f"error: --workload {module}:make: " + message.format(m=module)), line


def test_a_run_without_resume_over_a_checkpoint_says_it_will_replace_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rerunning the same command after a preemption, --resume forgotten, trained from step 0 and its first save
    replaced the earlier run's checkpoint without a word."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=8))
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "2")
    assert code == 0 and "note:" not in out, err
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "1")
    note = f"note: {Path('out') / 'checkpoint.pth'} exists and this run starts from step 0 (no --resume): its first checkpoint replaces"
    assert code == 0 and note in out, out
    # A refusal of the data is the only line: the note came before it.
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "1", "--batch-size", "100000")
    assert code != 0 and "note:" not in out and err.strip().splitlines()[-1].startswith("error: "), out + err
    code, out, err = _run_here(script, capfd, monkeypatch, "--resume", "--max-steps", "2")
    assert code == 0 and "note:" not in out, err


@pytest.mark.slow
def test_the_task_script_on_a_batch_norm_model_refuses_a_batch_of_one_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """BatchNorm's own refusal of a micro-batch of one sample, raised in the first step, is one line naming the flag."""
    script = _task_script(tmp_path, "batch_norm", autotune.TrainSetup(batch_size=4))
    code, _, err = in_process.run_main(script, [*_FLAGS, "--batch-size", "1"], script.parent, capfd, monkeypatch)
    assert code == 1 and err.splitlines() == [
        "error: Expected more than 1 value per channel when training, got input size torch.Size([1, 4]); a BatchNorm "
        "layer needs more than one value per channel to train on: pass --batch-size 2 or more"], err


def test_channels_last_on_a_model_with_5d_weights_is_one_line_in_the_script_and_the_helpers(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Conv3d beside a 4-D image input: `train.py --channels-last` ended in torch's 27-line traceback ("required rank 4
    tensor to use channels_last format"), and prepare_model in one's own loop raised torch's RuntimeError."""
    script = _task_script(tmp_path, "video_and_image", autotune.TrainSetup(batch_size=4, channels_last=True))
    line, _ = in_process.refusal(script, [*_FLAGS, "--max-steps", "1"], script.parent, capfd, monkeypatch)
    assert line.startswith("error: --channels-last: the model cannot take it (") and "pass --no-channels-last" in line, line
    assert _run_here(script, capfd, monkeypatch, "--max-steps", "1", "--no-channels-last")[0] == 0
    with pytest.raises(SetupError, match=r"^prepare_model: channels_last cannot convert this model \(.*rank 4.*\): use a setup with"):
        autotune.TrainSetup(channels_last=True).prepare_model(torch.nn.Conv3d(3, 4, 3))


def test_a_resumed_iterable_epoch_skips_what_it_trained_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of 24 samples at batch 8 is 3 steps an epoch: stopped after step 1, the resumed run reads past that
    step's micro-batch and ends the epoch at step 3, not at step 4 with the first batch trained twice."""
    script = _task_script(tmp_path, "iterable", autotune.TrainSetup(batch_size=8))
    code, _, err = _run_here(script, capfd, monkeypatch, "--max-steps", "1")
    assert code == 0, err
    code, out, err = _run_here(script, capfd, monkeypatch, "--resume", "--epochs", "1")
    assert code == 0, err
    assert "skipping the 1 micro-batches of epoch 0 trained on before the checkpoint" in out
    # Without --max-steps, an endless stream would never end its first epoch: the run's first lines say so.
    assert "| iterable dataset (an epoch ends where its iterator does; for an endless stream pass --max-steps N, or it never " \
        "ends)" in out
    assert [int(line.split()[1]) for line in out.splitlines() if line.startswith("step ")] == [2, 3]
    checkpoint = torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)
    assert (checkpoint["step"], checkpoint["epoch"], checkpoint["epoch_step"]) == (3, 1, 0)
    # Stopped on the epoch's last step: the resumed run finds the epoch done and goes on to the next.
    code, _, err = _run_here(script, capfd, monkeypatch, "--max-steps", "3", "--output-dir", "end")
    assert code == 0, err
    code, out, err = _run_here(script, capfd, monkeypatch, "--resume", "--epochs", "2", "--output-dir", "end")
    assert code == 0, err
    assert "note: epoch 0 ended within the 3 micro-batches skipped" in out
    assert [int(line.split()[1]) for line in out.splitlines() if line.startswith("step ")] == [4, 5, 6]


@pytest.mark.slow
def test_the_task_script_keeps_each_param_group_lr_and_warms_each_up_from_its_own(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _task_script(tmp_path, "sgd_groups", autotune.TrainSetup(batch_size=16))
    code, _, err = _run_here(script, capfd, monkeypatch, "--max-steps", "2")
    assert code == 0, err
    lrs = _checkpoint_lrs(tmp_path / "out")
    assert lrs == pytest.approx([0.1, 0.001])  # no warm-up: the factory's own rates, untouched
    code, _, err = _run_here(script, capfd, monkeypatch, "--max-steps", "2", "--warmup-steps", "4", "--output-dir", "out2")
    assert code == 0, err
    lrs = _checkpoint_lrs(tmp_path / "out2")
    assert lrs == pytest.approx([0.05, 0.0005])  # step 2 of 4: half of each group's own rate
    # Resumed with a shorter warm-up than the step reached: it ends at the full rates, not stuck at half of them.
    code, _, err = _run_here(script, capfd, monkeypatch, "--max-steps", "3", "--warmup-steps", "1", "--output-dir", "out2", "--resume")
    assert code == 0, err
    assert _checkpoint_lrs(tmp_path / "out2") == pytest.approx([0.1, 0.001])
    # A factory that sets 0.1 itself (Task.lr left at 1e-3): batch 16 x 2 doubles the recipe's batch, and SGD scales linearly.
    script = _task_script(tmp_path / "own", "sgd_own_rate", autotune.TrainSetup(batch_size=16, accumulation_steps=2))
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "1")
    assert code == 0 and "lr 0.1 x 32 / 16 = 0.2," in out, err  # the rate it trains at, not 1e-3 x 2
    assert _checkpoint_lrs(tmp_path / "own" / "out") == pytest.approx([0.2])
    # A sign-based or parameter-free optimizer's rule (--lr-scaling none): the rate is kept.
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "1", "--lr-scaling", "none", "--output-dir", "kept")
    assert code == 0 and "lr 0.1 x 1 (kept: --lr-scaling none) = 0.1," in out, err
    assert _checkpoint_lrs(tmp_path / "own" / "kept") == pytest.approx([0.1])


@pytest.mark.slow
def test_the_task_script_on_short_iterable_epochs_and_task_subclasses(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 24 items in micro-batches of 8, 2 per step: one step an epoch, the third micro-batch dropped, not carried over.
    script = _task_script(tmp_path, "iterable", autotune.TrainSetup(batch_size=8, accumulation_steps=2))
    code, out, err = _run_here(script, capfd, monkeypatch, "--epochs", "3")
    assert code == 0, err
    assert "epoch 2 done at step 3" in out
    code, out, err = _run_here(script, capfd, monkeypatch, "--max-steps", "1", "--output-dir", "one")
    assert code == 0 and "epoch 0 done" not in out, err  # stopped by --max-steps, not at the stream's end
    code, _, err = _run_here(script, capfd, monkeypatch, "--batch-size", "32")
    assert code != 0 and "yielded no full optimizer step of 32 x 2" in err
    # The stream's short last batch is trained (items 16-23 of 24 at batch 16), not dropped every epoch as it was.
    code, out, err = _run_here(script, capfd, monkeypatch, "--batch-size", "16", "--accum-steps", "1", "--epochs", "2", "--output-dir", "tail")
    assert code == 0 and "epoch 1 done at step 4" in out, err
    code, out, err = _run_here(script, capfd, monkeypatch, "--batch-size", "32", "--accum-steps", "1", "--epochs", "1", "--output-dir", "short")
    assert code == 0 and "epoch 0 done at step 1" in out, err  # a stream shorter than a batch: one step of its 24 items
    # A model with BatchNorm skips a last batch of one sample, which fails it (17 items at batch 16), said once...
    norm = _task_script(tmp_path / "norm", "iterable_batch_norm", autotune.TrainSetup(batch_size=16))
    code, out, err = _run_here(norm, capfd, monkeypatch, "--epochs", "2")
    assert code == 0 and "epoch 1 done at step 2" in out, out + err
    assert (out + err).count("note: a micro-batch of 1 sample (a loader worker's last of the stream) is skipped") == 1, out + err
    # A sample is a row of the batch, whatever batch_size_of counts (tokens: the lone sample's 10 were not skipped).
    tokens = _task_script(tmp_path / "tokens", "iterable_batch_norm_counted_in_tokens", autotune.TrainSetup(batch_size=16))
    code, out, err = _run_here(tokens, capfd, monkeypatch, "--epochs", "2")
    assert code == 0 and "epoch 1 done at step 2" in out and "is skipped" in out + err, out + err
    # ... and trains a longer one (items 12-16 at batch 12): every shorter tail was dropped, 36 of 100 items of a stream.
    code, out, err = _run_here(norm, capfd, monkeypatch, "--epochs", "2", "--batch-size", "12", "--output-dir", "longer")
    assert code == 0 and "epoch 1 done at step 4" in out and "is skipped" not in out + err, out + err
    # A BatchNorm kept in eval mode uses its running statistics, which a sample alone cannot fail: the tail is trained.
    frozen = _task_script(tmp_path / "frozen", "iterable_frozen_batch_norm", autotune.TrainSetup(batch_size=16))
    code, out, err = _run_here(frozen, capfd, monkeypatch, "--epochs", "2")
    assert code == 0 and "epoch 1 done at step 4" in out, out + err
    # ... unless it keeps no running statistics: in eval mode too it takes the batch's, which one sample fails. Skipped.
    stateless = _task_script(tmp_path / "stateless", "iterable_eval_batch_norm_without_statistics", autotune.TrainSetup(batch_size=16))
    code, out, err = _run_here(stateless, capfd, monkeypatch, "--epochs", "2")
    assert code == 0 and "epoch 1 done at step 2" in out, out + err
    # Every worker of this stream yields it whole (the search found so and offered one worker at most): refused.
    code, _, err = _run_here(script, capfd, monkeypatch, "--workers", "2")
    assert code != 0 and "error: --workers 2: each DataLoader worker yields the whole iterable dataset" in err
    code, out, err = _run_here(_task_script(tmp_path, "subclassed", autotune.TrainSetup(batch_size=16)), capfd, monkeypatch, "--max-steps", "1")
    assert code == 0 and "step 1 loss" in out, err


def test_the_task_script_without_autotune_is_refused_in_one_line(tmp_path: Path) -> None:
    """The Task script needs autotune (the Task is one): run where autotune cannot be imported, it ended in a 5-line
    ModuleNotFoundError traceback; it says so in one line."""
    import subprocess

    script = _task_script(tmp_path / "task", "good", autotune.TrainSetup(batch_size=4))
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "autotune.py").write_text("raise ImportError('no autotune here')\n")
    ran = subprocess.run([sys.executable, str(script), "--max-steps", "1"], capture_output=True, text=True, timeout=180,
                         cwd=shadow, env={**os.environ, "PYTHONPATH": str(shadow)})
    assert ran.returncode == 1 and ran.stderr.strip().splitlines() == [
        "error: this script trains an autotune.Task and needs autotune where it runs (pip install -e the autotune checkout "
        "the search ran from): ImportError: no autotune here"], ran.stderr


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_refusal_under_torchrun_is_said_by_rank_zero_alone_in_both_scripts(
    tmp_path: Path, synthetic_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, rank: str
) -> None:
    """Each script's ``__main__`` block, run here with the RANK torchrun gives each process: a refusal every rank meets
    (a model or workload that cannot be imported) is one line on rank 0; another rank exits 1 without repeating it."""
    import runpy

    from test_emit import make_best, write_script

    task = _task_script(tmp_path / "task", "good", autotune.TrainSetup(batch_size=4))
    classifier = write_script(make_best(synthetic_data), tmp_path / "classifier" / "train.py")
    monkeypatch.setenv("RANK", rank)
    for script, flags, said in (
        (task, ["--workload", "no_such_module_xyz:make"],
         "error: --workload no_such_module_xyz:make: cannot find module no_such_module_xyz; run from the directory that holds it\n"),
        (classifier, ["--model", "no_such_module_xyz:make"],
         "error: --model no_such_module_xyz:make: cannot find module no_such_module_xyz; run from the directory that holds it\n"),
    ):
        monkeypatch.setattr(sys, "argv", [str(script), *flags])
        with pytest.raises(SystemExit) as exited:
            runpy.run_path(str(script), run_name="__main__")
        assert exited.value.code == 1, script
        # Printed by the script itself, while torchrun's SIGTERM is held (not by the interpreter after it): on rank 0 alone.
        assert capsys.readouterr().err == (said if rank == "0" else ""), script


def test_the_task_script_compiled_on_a_cpu_trains_without_inductor_s_cuda_warning(tmp_path: Path) -> None:
    """--compile on a machine without CUDA printed "No CUDA runtime is found, using CUDA_HOME=..." at the first step."""
    script = _task_script(tmp_path, "good", autotune.TrainSetup(batch_size=4, compile="default"))
    ran = _run(script, "--max-steps", "2", "--workers", "0")
    assert ran.returncode == 0, ran.stderr
    assert "CUDA" not in ran.stderr, ran.stderr


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_bad_flag_is_one_line_in_both_scripts(
    tmp_path: Path, synthetic_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, rank: str
) -> None:
    """A mistyped flag or value printed argparse's usage of every flag first (25 lines), once per torchrun rank."""
    import runpy

    from test_emit import make_best, write_script

    task = _task_script(tmp_path / "task", "good", autotune.TrainSetup(batch_size=4))
    classifier = write_script(make_best(synthetic_data), tmp_path / "classifier" / "train.py")
    monkeypatch.setenv("RANK", rank)
    for script in (task, classifier):
        for flags, said in ((["--bacth-size", "8"], "unrecognized arguments: --bacth-size 8"),
                            (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
                            (["--epochs", "0"], "--epochs must be >= 1"),  # out of range: exit 1 once the process group was up
                            (["--seed", str(2**64)], "--seed must be a 64-bit integer (-2**63 to 2**63 - 1)")):
            monkeypatch.setattr(sys, "argv", [str(script), *flags])
            with pytest.raises(SystemExit) as exited:
                runpy.run_path(str(script), run_name="__main__")
            assert exited.value.code == 2, script
            expected = f"error: {said} (python train.py --help lists the flags)\n" if rank == "0" else ""
            assert capsys.readouterr().err == expected, script


def test_the_task_script_s_data_error_line_names_the_rank_and_reads_a_loader_worker_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line train.py exits with: the DataLoader raises a worker's error again with the worker's traceback as its
    message, whose last line is the error; the whole traceback goes to a file the line names; under torchrun the data's
    fault names the rank (each reads its own share) and its file, while a Task's own refusal, which every rank meets,
    does not."""
    from autotune.errors import WorkloadError
    from autotune.workloads.named import BadBatch, BadItem, error_line

    quoted = ("Caught BadItem in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
              '  File "worker.py", line 349, in _worker_loop\n    data = fetcher.fetch(index)\n'
              "autotune.workloads.named.BadItem: dataset[13] failed (in a loader worker): ValueError: corrupt record 13\n")
    hint = "; fix the item or the dataset's code, then rerun (--resume goes on from the last checkpoint)"
    assert error_line(BadItem(quoted)) == f"error: dataset[13] failed (in a loader worker): ValueError: corrupt record 13{hint}"
    assert error_line(BadItem(quoted), tmp_path) == (f"error: dataset[13] failed (in a loader worker): ValueError: corrupt record 13{hint}"
                                                     f"; its traceback: {tmp_path / 'error.log'}")
    assert "fetcher.fetch(index)" in (tmp_path / "error.log").read_text()  # the worker's frames, quoted in the message
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert error_line(BadItem("dataset[13] failed: ValueError: x"), tmp_path) == (
        f"error: rank 1: dataset[13] failed: ValueError: x{hint}; its traceback: {tmp_path / 'error-rank1.log'}")
    assert error_line(BadBatch("batch items 0..3 cannot be collated together")) == "error: rank 1: batch items 0..3 cannot be collated together"
    assert error_line(WorkloadError("Task model factory failed: RuntimeError: x"), tmp_path) == "error: Task model factory failed: RuntimeError: x"
    assert error_line(BadItem("dataset[1] failed: E: y"), tmp_path / "missing").endswith(hint)  # no folder: no file named


def test_the_task_script_s_loader_data_keeps_datapipes_streams_and_pickles_without_the_task() -> None:
    """The wrappers leave what the DataLoader must see as it is (an iterable dataset, a DataPipe it shards), name the
    item at fault of a Subset's batched read as the search does, and pickle as what they hold: a spawn-started worker
    gets the dataset and the collate_fn, never the Task (its model and lambdas)."""
    import pickle

    import task_factories
    from torch.utils.data import IterableDataset, Subset
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torch.utils.data.datapipes.map import SequenceWrapper

    from autotune.workloads.named import BadItem, named_data

    stream, sized, pipe, iter_pipe = (task_factories.Stream(), task_factories.SizedStream(), SequenceWrapper(list(range(8))),
                                      IterableWrapper(range(8)))
    assert named_data(pipe, None)[0] is pipe and named_data(iter_pipe, None)[0] is iter_pipe  # the loader shards these
    named_stream = named_data(stream, None)[0]
    assert isinstance(named_stream, IterableDataset) and [i for _, i in named_stream] == [i for _, i in stream] and not hasattr(named_stream, "__len__")
    assert len(named_data(sized, None)[0]) == len(sized)
    subset = Subset(task_factories._Corrupt(), list(range(40)))
    named, collate = named_data(subset, None)
    with pytest.raises(BadItem, match=r"^dataset\[13\] failed: ValueError: corrupt record 13$"):
        named.__getitems__([21, 13, 5])
    assert collate([named[0], named[1]])[0].shape == (2, 8)
    again, _ = pickle.loads(pickle.dumps((named, collate)))
    assert len(again) == 40

    class Batched:  # read only in batches: no __getitem__ to name one item by (before, its TypeError was named)
        def __len__(self) -> int:
            return 8

        def __getitems__(self, indices: list[int]) -> Any:
            raise ValueError("shard 2 unreadable")

    with pytest.raises(BadItem, match=r"^dataset\.__getitems__\(\[1, 2\]\) failed: ValueError: shard 2 unreadable$"):
        named_data(Batched(), None)[0].__getitems__([1, 2])



def test_a_long_error_is_cut_at_a_word_end_before_its_hint() -> None:
    """DDP's unused-parameter error ended `... find_unused_parameters=True` to `t; some of the model's ...`."""
    message = ("Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
               "that your module has parameters that were not used in producing loss. You can enable unused parameter "
               "detection by passing the keyword argument `find_unused_parameters=True` to `torch.nn.parallel."
               "DistributedDataParallel`, and by making sure all `forward` function outputs participate in calculating loss.")
    error = classify(RuntimeError(message)).error or ""
    said, hint = error.split("; some of the model's parameters get no gradient", 1)
    assert said.endswith(" ...") and len(said) <= 300 and said[:-4] == said[:-4].rstrip() and message.startswith(said[14:-4]), said
    assert hint.endswith("needs find_unused_parameters, which DDP trials do not measure: search it without --nproc-per-node "
                         "(the emitted train.py takes --find-unused-parameters)")
    path = "/data/" + "x" * 320 + ".jpg"  # no space near the end: cut inside the path, not back to before it
    said = classify(FileNotFoundError(2, "No such file or directory", path)).error or ""
    assert said.startswith("FileNotFoundError: [Errno 2] No such file or directory: '/data/xxx") and said.endswith("x ...")


def test_a_task_factory_given_as_a_model_is_told_to_use_workload() -> None:
    """``--model mod:make_task`` said only that the factory returned Task, not a Module."""
    from autotune.errors import WorkloadError
    from autotune.workloads.models import build_model

    with pytest.raises(WorkloadError, match=r"^factory task_factories:good returned Task, not a torch.nn.Module \(an autotune.Task "
                                            r"is given with --workload, not --model\)$"):
        build_model("task_factories:good", num_classes=2, image_size=32, sys_path=[str(Path(__file__).parent)])


def test_a_task_model_not_in_float32_is_offered_only_the_autocasts_it_can_train_in() -> None:
    """CPU autocast leaves a float64 model alone: a trial of amp=bf16 would measure amp=off labelled bf16. fp16's
    GradScaler cannot unscale float16 (nor, in many torch versions, bfloat16) gradients: every fp16 trial of a model with
    such parameters would fail. The Task's check reads the model's dtypes; the calibration measures no reduced precision
    for a float64 model, the space leaves those values out and says what "fp32" means there, and --set asking only for
    them is refused in one line that says why and what works."""
    from test_calibrate import FakeRunner

    from autotune.tuner.offered import autocasts, check_workload_constraints

    plain, wide, brain, mixed = _workload("good"), _workload("float64"), _workload("bfloat16"), _workload("half_and_single")
    assert (plain.precision, wide.precision, brain.precision, mixed.precision) == (None, "float64", "bfloat16", "float16+float32")
    assert "precision" not in plain.to_dict()  # as before the field: an older version reads this best.json
    assert Workload.from_dict(json.loads(json.dumps(wide.to_dict()))) == wide

    def space(workload: Workload, **constraints: str):
        return build_space(device=CPU, calibration=_calibration(), usable_cores=2, effective_batch=None, image_input=False,
                           constraints={k: parse_constraint(f"{k}={v}") for k, v in constraints.items()}, workload=workload)

    assert space(plain).values["amp"] == ("off", "bf16") and not space(plain).note
    assert space(wide).values["amp"] == ("off",)
    assert space(brain).values["amp"] == space(mixed).values["amp"] == ("off", "bf16")  # bf16 acts on them (a float32 loss)
    every = ("off", "bf16", "fp16")
    assert (autocasts(every, plain), autocasts(every, wide), autocasts(every, brain), autocasts(every, mixed)) == (
        every, ("off",), ("off", "bf16"), ("off", "bf16"))
    assert "the Task's model is in float64: fp32 in a setup's name means no autocast" in space(wide).note
    with pytest.raises(UsageError, match=r"^--set amp=bf16: the Task's model is in float64, which autocast leaves alone: amp=bf16 would "
                                         r"compute as amp=off; use amp=off$"):
        space(wide, amp="bf16")
    assert space(wide, amp="off").values["amp"] == space(wide, amp="off,bf16").values["amp"] == ("off",)
    gpu = DeviceInfo("cuda:0", bf16=True, memory_total_bytes=2**34, memory_free_bytes=2**34, label="test GPU")
    with pytest.raises(UsageError, match=r"^--set amp=fp16: the Task's model has bfloat16 parameters, whose gradients fp16's "
                                         r"GradScaler cannot unscale; use amp=off or amp=bf16$"):
        check_workload_constraints({"amp": parse_constraint("amp=fp16")}, brain, gpu)
    check_workload_constraints({"amp": parse_constraint("amp=fp16,bf16")}, brain, gpu)  # bf16 is left: no refusal
    refused = cli.invoke(app, ["trial", "--workload", "task_factories:float64", "--amp", "bf16", "--device", "cpu"])
    assert refused.exit_code == 2 and refused.output.strip().endswith(
        "--amp bf16: the Task's model is in float64, which autocast leaves alone: --amp bf16 would compute as --amp off")

    runner, lines = FakeRunner(), []
    calibration = calibrate(wide, CPU, usable_cores=2, available_bytes=2**34, max_memory=None, trial_seconds=3.0, bf16_ok=True,
                            runner=runner, log=lines.append)
    assert {p.amp for p in calibration.precisions} == {"off"} and {s.amp for mode, s in runner.calls} == {"off"}
    assert any(line.startswith("compute only (batch ") and ", float64, contiguous): " in line for line in lines), lines
    calibration = calibrate(plain, CPU, usable_cores=2, available_bytes=2**34, max_memory=None, trial_seconds=3.0, bf16_ok=True,
                            runner=FakeRunner(), log=lambda line: None)
    assert {p.amp for p in calibration.precisions} == {"off", "bf16"}


def test_a_search_of_a_float64_task_trains_it_in_float64_and_its_best_json_says_what_fp32_means(tmp_path: Path) -> None:
    """End to end with real trials: no trial autocasts, and the winner's notes say the model's own dtype ran."""
    config = SearchConfig(model="ignored", trials=3, device="cpu", trial_seconds=0.5, out=tmp_path / "out", confirm_top=1,
                          confirm_rounds=1, ceilings=False, workload="task_factories:float64")
    outcome = run_search(config)
    assert outcome.records and all(r.setup.amp == "off" for r in outcome.records)
    assert any(r.result.ok for r in outcome.records)
    best = outcome.best
    assert best is not None and best.workload.precision == "float64"
    assert any(n.startswith("the Task's model is in float64: fp32 in a setup's name means no autocast") for n in best.notes)
    assert json.loads((tmp_path / "out" / "best.json").read_text())["workload"]["precision"] == "float64"
    assert read_best(tmp_path / "out").workload == best.workload


def test_a_study_of_a_float64_task_model_resumes_only_with_the_same_precision() -> None:
    """A version that did not read the model's dtype searched bf16 for a float64 model (its trials ran float64 labelled
    bf16): its study is not resumed; a float32 model's signature is as before, so its studies are."""
    from autotune.tuner.identity import signature, signature_difference

    def signed(workload: Workload) -> dict:
        config = SearchConfig(model="ignored", trials=3, device="cpu", workload=f"task_factories:{workload.task.split(':')[1]}")
        return json.loads(json.dumps(signature(config, workload)))

    wide, plain = signed(_workload("float64")), signed(_workload("good"))
    assert wide["precision"] == "float64" and "precision" not in plain
    earlier = {k: v for k, v in wide.items() if k != "precision"}
    assert signature_difference(earlier, wide) == ("the model's precision: float32 (or not read: an earlier autotune version) there, "
                                                   "'float64' now")
    assert signature_difference(plain, plain) is None


def test_a_task_whose_factory_compiles_its_model_is_offered_no_compile_and_says_so() -> None:
    """A factory returning torch.compile(model) was searched with compile=off|default: every trial compiled it anyway, a
    compiled trial compiled it twice, and best.json said compile=off without a word."""
    from autotune.runner.launch import COMPILE_ALLOWANCE_S, with_compile_allowance
    from autotune.tuner.offered import check_workload_constraints, compiled_note, torch_knob_values

    workload = build_task_workload("task_factories:compiled", device="cpu")
    assert workload.compiled is True and Workload.from_dict(workload.to_dict()).compiled is True
    assert "compiled" not in build_task_workload("task_factories:good", device="cpu").to_dict()  # not compiled: left out
    cpu = DeviceInfo(name="cpu", bf16=True, memory_total_bytes=None, memory_free_bytes=None, label="cpu")
    assert torch_knob_values(cpu, workload, 2)["compile"] == ("off",)
    with pytest.raises(UsageError, match=r"^--set compile: the Task's factory returns a model torch.compile wraps, .*; return the plain "
                                         r"module to let the search measure compiling against eager"):
        check_workload_constraints({"compile": parse_constraint("compile=default")}, workload, cpu)
    assert compiled_note(workload).endswith("the search did not measure compiling against eager") and not compiled_note(None)
    options = TrialOptions(trial_seconds=1.0, timeout_s=60.0)
    assert with_compile_allowance(TrainSetup(), options, workload).timeout_s == 60.0 + COMPILE_ALLOWANCE_S  # it compiles in warm-up
    assert with_compile_allowance(TrainSetup(), options, dataclasses.replace(workload, compiled=None)) == options
    # One trial asked to compile it is refused alike (it compiled a compiled module), before any process starts.
    with pytest.raises(SetupError, match=r"^compile=default: the Task's factory returns a model torch.compile wraps, .*; return the plain "):
        autotune.trial("task_factories:compiled", setup=TrainSetup(compile="default"), device="cpu", trial_seconds=1.0)


def test_a_default_optimizer_that_fails_is_not_called_the_task_s_factory(monkeypatch) -> None:
    """A Task without an optimizer factory read `the Task's optimizer factory failed` when building the default AdamW
    failed (a broken torch._dynamo after an interrupted import, in a notebook's session)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("module 'sympy' has no attribute 'logic'")

    monkeypatch.setattr(torch.optim, "AdamW", broken)
    with pytest.raises(WorkloadError, match=r"^building the default optimizer \(AdamW\) over the model failed: AttributeError: "):
        _workload("good")


def test_checking_a_task_leaves_the_caller_s_random_generators_as_they_were() -> None:
    """A notebook seeded once drew other numbers after autotune.search or autotune.trial on a Task: its factory built
    the model (weights drawn from torch's generator) and the check trained a step, in the caller's process."""
    import random

    torch.manual_seed(0)
    random.seed(0)
    build_task_workload("task_factories:good", device="cpu", workers=False)
    after = (torch.rand(3), random.random())
    torch.manual_seed(0)
    random.seed(0)
    assert torch.equal(after[0], torch.rand(3)) and after[1] == random.random()
