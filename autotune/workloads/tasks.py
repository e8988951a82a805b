"""The user's workload factory: resolve it, load its :class:`Task`, check it before any trial.

:func:`build_task_workload` runs in the parent, before anything is written:
the factory imports and returns a Task, the dataset is not empty, its first
items collate, the first batch runs forward and loss to a scalar on the CPU,
and (when the search may use loader workers that do not start by fork) the
dataset and collate_fn pickle. Each failure is one :class:`~autotune.errors.WorkloadError` line
naming the object, index, types or shapes at fault.
"""

from __future__ import annotations

import functools
import inspect
import os
import pickle
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from autotune.errors import USER_CODE_ERRORS, WorkloadError
from autotune.records import TrialOptions, Workload
from autotune.workloads.batches import describe_batch, has_image_tensor, hinted
from autotune.workloads.collation import batched_fixed_shapes, batched_read, collate_items, fixed_shapes, read_batch
from autotune.workloads.counts import check_count
from autotune.workloads.factory_time import check_factory_time, watched
from autotune.workloads.loss_inputs import check_loss_weights, check_no_backward, float_targets, gradients, one_argument_hint, pass_warnings, reaches
from autotune.workloads.models import arguments_hint, load_factory
from autotune.workloads.modes import eval_modules, has_batch_norm, left_as_found, random_state_kept, train_mode
from autotune.workloads.optimizer_factory import checks_gradient_kinds, gradient_kind_mismatch, own_rate_warnings, unpacking_hint
from autotune.workloads.same_task import trainable_parameters
from autotune.workloads.task import Task
from autotune.workloads.task_refs import task_ref

__all__ = ["TaskInfo", "build_task_workload", "check_task", "collate_items", "load_task", "task_ref"]

#: Items the parent-side check collates into its first batch.
CHECK_ITEMS = 2
#: Items read to judge whether batches keep their shapes (variable-length items are often the exception, not the rule).
SHAPE_ITEMS = 8


def load_task(ref: str, sys_path: Sequence[str] = ()) -> Task:
    """Import the factory, call it, and return its Task.

    Raises:
        WorkloadError: The factory cannot be imported, fails, or returns something other than an ``autotune.Task``.
    """
    return call_factory(ref, load_factory(task_ref(ref), sys_path, what="workload"))[0]


def call_factory(ref: str, func: Callable[[], Any]) -> tuple[Task, float]:
    """Call an imported workload factory: its Task and the seconds the call took.

    Raises:
        WorkloadError: As :func:`load_task`.
    """
    started = time.perf_counter()
    try:
        task = func()
    except WorkloadError as exc:  # the Task it built refused its own arguments (loss= and step=, say)
        raise WorkloadError(f"workload {ref}: {exc}") from None
    except USER_CODE_ERRORS as exc:  # its traceback is the user's own code's: a Python caller sees it as the cause
        raise WorkloadError(f"workload {ref} failed: {type(exc).__name__}: {exc}{arguments_hint(func, exc)}") from exc
    if not isinstance(task, Task):
        raise WorkloadError(f"workload {ref} returned {type(task).__name__}, not an autotune.Task")
    return task, time.perf_counter() - started


@dataclass(frozen=True)
class TaskInfo:
    """What the parent-side check learned about a Task.

    Attributes:
        samples: ``len(dataset)``, or ``None`` for an iterable dataset.
        iterable: Whether the dataset is an ``IterableDataset``.
        image_input: Whether the first batch holds a 4-D floating tensor.
        batch: The first batch's shapes and dtypes, in words.
        lr_scaling: ``"sqrt"``, ``"linear"`` or ``"none"`` (the rate kept), from the Task's optimizer.
        lr: The recipe's learning rate (see :meth:`Task.recipe_lr`).
        fixed_shapes: Whether the first items all have the same tensor shapes.
        unsharded: Whether two loader workers yielded the same items (see
            :func:`autotune.workloads.streams.workers_repeat_items`).
        parameters: Elements of the model's trainable parameters.
        precision: The model's floating parameters' dtype when not float32 (see :attr:`Workload.precision`).
        batch_norm: Whether the model holds a BatchNorm layer that trains (:func:`~autotune.workloads.modes.has_batch_norm`).
        compiled: Whether the factory returned the model ``torch.compile`` wrapped (see :attr:`Workload.compiled`).
    """

    samples: int | None
    iterable: bool
    image_input: bool
    batch: str
    lr_scaling: str = "sqrt"
    lr: float = 1e-3
    fixed_shapes: bool = True
    unsharded: bool = False
    parameters: int = 0
    precision: str | None = None
    batch_norm: bool = False
    compiled: bool = False


def _first_items(task: Task, count: int) -> tuple[list[Any], bool, int | None]:
    from torch.utils.data import IterableDataset

    dataset = task.dataset
    if isinstance(dataset, IterableDataset):
        items = []
        try:
            for index, item in enumerate(dataset):
                items.append(item)
                if index + 1 >= count:
                    break
        except USER_CODE_ERRORS as exc:
            raise WorkloadError(f"iterating the workload's dataset ({type(dataset).__name__}) failed: {type(exc).__name__}: {exc}") from None
        if not items:
            raise WorkloadError(f"the workload's dataset ({type(dataset).__name__}) yields no items")
        return items, True, None
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        once = ("; a generator is used up after one pass: give an IterableDataset whose __iter__ makes a new one each time"
                if inspect.isgenerator(dataset) or inspect.isgeneratorfunction(dataset) else
                "; pass its .dataset (and collate_fn=its .collate_fn): a Task's loader is the one autotune tunes"
                if hasattr(dataset, "batch_sampler") and hasattr(dataset, "dataset") else "")  # a DataLoader
        raise WorkloadError(
            f"the workload's dataset ({type(dataset).__name__}) is neither a map-style Dataset (__getitem__ and __len__) "
            f"nor an IterableDataset{once}"
        )
    try:
        size = len(dataset)
    except USER_CODE_ERRORS as exc:  # a __len__ that raises, or returns no int
        raise WorkloadError(f"len(dataset) of the workload's dataset ({type(dataset).__name__}) failed: {type(exc).__name__}: {exc}") from None
    if size < 1:
        raise WorkloadError(f"the workload's dataset ({type(dataset).__name__}) is empty")
    if batched_read(dataset) is not None:  # read as the DataLoader reads it: by index lists, see read_batch
        return list(range(min(count, size))), False, size
    items = []
    for index in range(min(count, size)):
        try:
            items.append(dataset[index])
        except USER_CODE_ERRORS as exc:
            raise WorkloadError(f"dataset[{index}] failed: {type(exc).__name__}: {exc}") from None
    return items, False, size


def _check_loss(task: Task, model: Any, batch: Any) -> Any:
    """The first batch's loss (a scalar tensor), or a WorkloadError naming what fails."""
    import torch

    shapes = describe_batch(batch)
    if task.step is not None:
        before = gradients(model)
        try:
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                loss = task.step(model, batch)
        except USER_CODE_ERRORS as exc:
            raise WorkloadError(f"step(model, batch) failed on the first batch {shapes}: " + hinted(f"{type(exc).__name__}: {exc}")) from None
        check_no_backward(model, before)
        pass_warnings(warned, lambda said: (
            f"step(model, batch) computes a loss whose output and targets differ in shape and broadcast ({said}), so it would "
            "train every output against every target of the batch: give the targets the output's shape (targets.unsqueeze(1) "
            "for one value per sample), or squeeze the model's output"))
        origin = "step(model, batch)"
    else:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise task.not_pairs(shapes)
        inputs, targets = batch
        try:
            output = model(inputs)
        except USER_CODE_ERRORS as exc:
            raise WorkloadError(f"the model's forward failed on the first batch (inputs {describe_batch(inputs)}): "
                                + hinted(f"{type(exc).__name__}: {exc}") + one_argument_hint(model, exc, task.loss is not None)) from None
        if task.loss is None and isinstance(output, torch.Tensor) and output.dim() >= 2 and output.shape[1] == 1:
            raise WorkloadError(f"the model outputs one value per sample ({describe_batch(output)}) and the default loss is "
                                "cross-entropy, which is 0 over a single class: nothing would train; pass autotune.Task(loss=...), "
                                "such as nn.MSELoss() for regression or nn.BCEWithLogitsLoss() for one logit")
        if task.loss is None and (kind := float_targets(output, targets)) is not None:
            what, why, fix = kind
            raise WorkloadError(f"the targets are {what} ({describe_batch(targets)}): {why}, and the default loss is cross-entropy over "
                                f"classes, which takes class indices or probabilities summing to 1; pass autotune.Task(loss={fix})")
        try:
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                loss = task.criterion()(output, targets)
        except USER_CODE_ERRORS as exc:
            several = isinstance(output, (tuple, list, dict))  # auxiliary heads, (logits, features), a dict of outputs
            raise WorkloadError(
                f"the loss failed on output {describe_batch(output)} and targets {describe_batch(targets)}: {type(exc).__name__}: {exc}"
                + (f"; the model returns a {_kind(output)}, and {'loss=' if task.loss is not None else 'the default loss'} "
                   "gets it whole: give a loss that takes it, or step=lambda model, batch: ... that picks the output to train on"
                   if several else "")
            ) from None
        pass_warnings(warned, lambda _said: (
            f"the loss got output {describe_batch(output)} and targets {describe_batch(targets)} of another shape and "
            "broadcasts them (PyTorch's warning), so it would train every output against every target of the batch: "
            "give the targets the output's shape (targets.unsqueeze(1) for one value per sample, or float targets "
            "shaped as the output), or squeeze the model's output"))
        origin = "the loss"
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
        got = describe_batch(loss) if isinstance(loss, torch.Tensor) else type(loss).__name__
        hint = ("; return the loss alone (logs such as accuracy are not trained on)" if isinstance(loss, (tuple, list, dict))  # (loss, logs)
                else "; return the tensor itself (.item() and float() detach it from the graph)" if isinstance(loss, (float, int)) else "")
        raise WorkloadError(f"{origin} must return a scalar floating tensor, got {got}{hint}")
    if not bool(torch.isfinite(loss.detach())):
        raise WorkloadError(f"{origin} returned {loss.item()} on the first batch {shapes}: the loss must be finite")
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not loss.requires_grad:
        if not trainable:
            raise WorkloadError("the model has no trainable parameters (none requires grad): there is nothing to train")
        raise WorkloadError(f"{origin} returned a tensor that does not require grad (detached, or computed under no_grad)")
    if trainable and reaches(loss, trainable) is False:
        raise WorkloadError(f"{origin} returned a loss that no parameter of the model it was given reaches (it computes it with "
                            "another model, a global one, say): every trial and train.py would train nothing of it; compute the "
                            "loss with the model that step() receives")
    return loss


@contextmanager
def _trained_as_found(model: Any) -> Iterator[None]:
    """``model`` in training mode as the trials train it (the modules its factory left in eval mode kept so), on a random
    state of its own; on exit as it was found: the Task may hold the user's own model object."""
    import torch

    with left_as_found(model), torch.random.fork_rng():
        train_mode(model, eval_modules(model))
        yield


def _kind(output: tuple[Any, ...] | list[Any] | dict[Any, Any]) -> str:
    """``tuple``, ``list`` or ``dict``, with the class's own name where it is another (a namedtuple: ``tuple (Out)``)."""
    kind = next(t.__name__ for t in (tuple, list, dict) if isinstance(output, t))
    return kind if type(output).__name__ == kind else f"{kind} ({type(output).__name__})"


def worker_start_method() -> str:
    """How DataLoader workers start here: the method set in this process (a workload's module may set one as it is
    imported, as trials and train.py import it too), or the platform's default."""
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def _check_pickle(task: Task) -> None:
    """Workers started by fork (Linux's default up to Python 3.13) inherit the dataset and collate_fn;
    other start methods (spawn, forkserver) pickle them."""
    if worker_start_method() == "fork":
        return
    for name in ("dataset", "collate_fn"):
        value = getattr(task, name)
        if value is None:
            continue
        try:
            pickle.dumps(value)
        except USER_CODE_ERRORS as exc:
            raise WorkloadError(
                f"the workload's {name} ({type(value).__name__}) cannot be pickled for DataLoader workers: "
                f"{type(exc).__name__}: {exc}; make it picklable (a top-level class; files and connections opened lazily "
                "in __getitem__) or pass --set num_workers=0"
            ) from None


def check_task(task: Task, *, workers: bool, warn: Callable[[str], None] | None = None) -> TaskInfo:
    """Check a Task on the CPU, in this process, before any trial.

    Args:
        task: The loaded Task.
        workers: Whether the search may use loader workers (then the dataset
            and collate_fn must pickle).
        warn: Where a note on the Task is said (a batch that counts several rows per item).

    Raises:
        WorkloadError: Empty dataset, items that do not collate, a model whose
            forward fails, a loss that is not a scalar, an unpicklable object.
    """
    items, iterable, size = _first_items(task, SHAPE_ITEMS)
    batched = not iterable and batched_read(task.dataset) is not None  # items are then indices, read_batch reads them

    @functools.cache  # each count read and collated once: the strict read of all of them serves the count check too
    def first(count: int) -> Any:
        return read_batch(task, items[:count]) if batched else collate_items(task.collate, items[:count])

    batch = first(CHECK_ITEMS)
    if batched:
        first(len(items))  # every item the per-item path reads, read as strictly
    check_count(task, batch, first, len(items), CHECK_ITEMS, warn)
    model = task.build_model()
    with _trained_as_found(model):
        _check_loss(task, model, batch)
    unsharded = False
    if workers:
        _check_pickle(task)
        if iterable:
            from autotune.workloads.streams import workers_repeat_items

            unsharded = workers_repeat_items(task.dataset)
    try:
        optimizer = task.build_optimizer(model.parameters(), lr=None, cuda=False)
        lr = task.recipe_lr(optimizer)
    except WorkloadError:
        raise
    except USER_CODE_ERRORS as exc:
        what = "the Task's optimizer factory" if task.optimizer is not None else "building the default optimizer (AdamW) over the model"
        raise WorkloadError(f"{what} failed: {type(exc).__name__}: {exc}{unpacking_hint(exc)}") from None
    own_rates = task.optimizer is not None and not task._factory_takes_lr  # given lr=, its scheduler starts from the scaled rate
    if warn is not None and own_rates:  # a Task's lr= that the factory's own rate replaces is said too
        for said in own_rate_warnings(optimizer, lr, task.batch_size, task.lr if getattr(task, "_lr_given", False) else None):
            warn(said)
    check_loss_weights(task, model, optimizer)
    if checks_gradient_kinds(model, optimizer):  # one backward tells which gradients are sparse (F.embedding(sparse=True) too)
        with _trained_as_found(model):
            try:
                _check_loss(task, model, batch).backward()
            except USER_CODE_ERRORS as exc:
                raise WorkloadError(f"the first batch's backward failed: {type(exc).__name__}: {exc}") from None
            if (mismatch := gradient_kind_mismatch(model, optimizer)) is not None:
                raise WorkloadError(mismatch)
    return TaskInfo(
        samples=size,
        iterable=iterable,
        image_input=has_image_tensor(batch),
        batch=describe_batch(batch),
        lr_scaling=task.lr_scaling(optimizer),
        lr=lr,
        fixed_shapes=batched_fixed_shapes(task, items) if batched else fixed_shapes(task, items),
        unsharded=unsharded,
        parameters=trainable_parameters(model),
        precision=model_precision(model),
        batch_norm=has_batch_norm(model),
        compiled=hasattr(model, "_orig_mod"),  # torch.compile's OptimizedModule wraps the module it compiles
    )


def model_precision(model: Any) -> str | None:
    """The dtypes of ``model``'s floating parameters joined by ``+`` (``"float64"``), or None where all are float32."""
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})
    return None if dtypes in ([], ["float32"]) else "+".join(dtypes)


def _import_root(module_name: str) -> str | None:
    """The sys.path entry an imported module was found under (so trials import it the same way)."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    root = os.path.dirname(os.path.abspath(file))
    depth = module_name.count(".") + (1 if os.path.basename(file) == "__init__.py" else 0)
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def build_task_workload(workload: str | Callable[..., Any], *, device: str, workers: bool = True, options: TrialOptions | None = None,
                        warn: Callable[[str], None] | None = None) -> Workload:
    """Load and check the user's workload factory; return its Workload record.

    Args:
        workload: ``"package.module:function"`` or the factory itself.
        device: The resolved device.
        workers: Whether the search may use loader workers.
        options: The runs' options, whose timeout the factory's time is checked against (None: not checked).
        warn: Where a slow factory (:func:`~autotune.workloads.factory_time.check_factory_time`) and notes on the Task are said.

    Raises:
        WorkloadError: See :func:`load_task` and :func:`check_task`; a factory too slow for the runs' timeout.
    """
    ref = task_ref(workload)
    sys_path: tuple[str, ...] = (os.getcwd(),)
    with random_state_kept():  # the caller's generators as they were: a seeded notebook draws the same numbers after
        factory = load_factory(ref, sys_path, what="workload")  # its module's import too
        task, took = watched(lambda: call_factory(ref, factory), ref, options, warn)
        if options is not None:
            check_factory_time(ref, took, options, warn, again=lambda: call_factory(ref, factory)[1])
        info = watched(lambda: check_task(task, workers=workers, warn=warn), ref, options, warn, "its first batch's step")
    root = _import_root(ref.partition(":")[0])
    if root is not None:  # where this process found the module, first: trials and train.py import that file, not a
        sys_path = (root, *(p for p in sys_path if p != root))  # same-named one in a working directory changed since
    return Workload(
        model=ref,
        device=device,
        images=info.samples,
        lr=info.lr,
        sys_path=sys_path,
        task=ref,
        reference_batch=task.batch_size,
        image_input=info.image_input,
        iterable=info.iterable,
        lr_scaling=info.lr_scaling,
        fixed_shapes=info.fixed_shapes,
        own_optimizer=task.optimizer is not None,
        unsharded=info.unsharded,
        parameters=info.parameters,
        precision=info.precision,
        batch_norm=info.batch_norm,
        compiled=info.compiled or None,
    )
