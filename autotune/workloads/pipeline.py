"""What a trial trains, behind one interface: the classifier shorthand or the user's Task.

A trial process asks :func:`open_pipeline` for the workload's pipeline and
uses only its methods: the dataset and collate function the loader reads,
the model, the optimizer, the loss of one batch, the samples in a batch and
a batch for the compute-only measurement. The classifier shorthand
(``--model``/``--data``/``--image-size``) is one pipeline, the user's
:class:`~autotune.workloads.task.Task` the other.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from autotune.errors import USER_CODE_ERRORS, WorkloadError
from autotune.records import Workload
from autotune.workloads.batches import first_dim
from autotune.workloads.collation import ItemsWrapper, bad_item, batched_read, collate_items, read_batch
from autotune.workloads.data import BadData

#: How a trial's error says that one pass of a stream held no optimizer step (the search counts such a trial free).
NO_FULL_STEP = "yields no full optimizer step"

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.train_setup import TrainSetup
    from autotune.workloads.production import ProductionClock

__all__ = ["NO_FULL_STEP", "REITERATED", "ClassifierPipeline", "Pipeline", "TaskPipeline", "endless_batches", "open_pipeline"]

#: An iterable dataset whose second pass is empty: a one-shot stream (its ``__iter__`` returns an iterator made once).
REITERATED = (
    "the workload's dataset yields not one batch when iterated a second time (its first pass did): its __iter__ must "
    "start the stream anew on every call (a DataLoader iterates it once per epoch); an iterator or generator made "
    "once, in __init__, is used up by the first pass"
)


class Pipeline(Protocol):
    """What a trial needs to know about the workload."""

    def dataset(self) -> Any:
        """The training dataset (map-style or iterable)."""
        ...

    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        """The loader's collate function (``None``: PyTorch's default)."""
        ...

    def model(self) -> torch.nn.Module:
        """A freshly initialised model, on the CPU."""
        ...

    def optimizer(self, params: Any, *, lr: float, cuda: bool, impl: str | None = None) -> torch.optim.Optimizer:
        """The optimizer over ``params`` (``impl``: for-loop, foreach or fused; ``None``: torch's choice)."""
        ...

    def loss(self, model: Any, batch: Any) -> Any:
        """The scalar loss of one batch already on the device."""
        ...

    def samples(self, batch: Any) -> int:
        """Samples in a batch."""
        ...

    def example_batch(self, batch_size: int) -> Any:
        """A batch of the real shape, on the CPU (compute-only measurement, first step)."""
        ...


class ClassifierPipeline:
    """The image-classifier shorthand: torchvision model or factory, ImageFolder or synthetic JPEGs, cross-entropy, AdamW."""

    def __init__(self, workload: Workload, decode: str = "cpu") -> None:
        self.workload = workload
        self.num_classes = workload.num_classes or 10
        self.decode = decode

    def dataset(self) -> Any:
        """The ImageFolder (synthetic JPEGs without ``data``) with the training transform
        (with ``decode="gpu"``: the files' bytes, decoded later on the device)."""
        from autotune.workloads.data import ensure_synthetic, image_folder
        from autotune.workloads.gpu_decode import byte_folder

        root = self.workload.data or ensure_synthetic(self.workload.cache_dir, self.workload.synthetic_images)
        try:
            dataset = byte_folder(str(root)) if self.decode == "gpu" else image_folder(root, self.workload.image_size)
        except FileNotFoundError as exc:  # a class folder emptied while the search ran (a folder gone: the search says so)
            if not os.path.isdir(root):
                raise
            raise BadData(f"{root}: {exc}; files were removed while the search ran: put them back") from None
        self.num_classes = len(dataset.classes)
        return dataset

    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        """PyTorch's default collate; a list of byte tensors for GPU decoding."""
        from autotune.workloads.gpu_decode import collate_bytes

        return collate_bytes if self.decode == "gpu" else None

    def model(self) -> torch.nn.Module:
        """The classifier for the data's classes."""
        from autotune.workloads.models import build_model

        return build_model(
            self.workload.model,
            num_classes=self.num_classes,
            image_size=self.workload.image_size,
            sys_path=self.workload.sys_path,
        )

    def optimizer(self, params: Any, *, lr: float, cuda: bool, impl: str | None = None) -> torch.optim.Optimizer:
        """AdamW with the ``impl`` kernels (``None``: torch's own choice)."""
        import torch

        from autotune.torch_knobs import optimizer_kwargs

        return torch.optim.AdamW(params, lr=lr, **optimizer_kwargs(impl))

    def loss(self, model: Any, batch: Any) -> Any:
        """Cross-entropy of ``model(images)`` against the labels (auxiliary classifiers included)."""
        from autotune.workloads.models import classification_loss

        images, labels = batch
        return classification_loss(model(images), labels)

    def samples(self, batch: Any) -> int:
        """Images in the batch: its labels (with ``decode="gpu"`` the images are a list of files' bytes)."""
        return first_dim(batch[1])

    def example_batch(self, batch_size: int) -> Any:
        """Random images and labels of the real shape."""
        import torch

        size = self.workload.image_size
        return torch.randn(batch_size, 3, size, size), torch.randint(0, self.num_classes, (batch_size,))


class TaskPipeline:
    """The user's Task, loaded from its factory in this process."""

    def __init__(self, workload: Workload) -> None:
        from autotune.workloads.tasks import load_task

        assert workload.task is not None
        self.task = load_task(workload.task, workload.sys_path)

    def dataset(self) -> Any:
        """The Task's dataset; a map-style one names an item that raises (:class:`NamedItems`)."""
        from torch.utils.data import IterableDataset

        dataset = self.task.dataset
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or hasattr(dataset, "__getitems__"):
            return dataset  # a stream has no index to name; a batched __getitems__ of its own is kept as it is
        return NamedItems(dataset)

    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        """The Task's collate_fn (or PyTorch's default), whose failure in the trial's own process names the items."""
        from torch.utils.data import default_collate

        return NamedCollate(self.task.collate_fn or default_collate)  # not the Task's method: workers would pickle the Task

    def model(self) -> torch.nn.Module:
        """The Task's model (its factory called, when it is one)."""
        return self.task.build_model()

    def optimizer(self, params: Any, *, lr: float, cuda: bool, impl: str | None = None) -> torch.optim.Optimizer:
        """The Task's optimizer, default AdamW (``impl`` applies to the default only)."""
        return self.task.build_optimizer(params, lr=lr, cuda=cuda, impl=impl)

    def loss(self, model: Any, batch: Any) -> Any:
        """``step(model, batch)`` or ``loss(model(inputs), targets)``."""
        return self.task.compute_loss(model, batch)

    def samples(self, batch: Any) -> int:
        """``batch_size_of(batch)`` or the first dimension."""
        return self.task.samples_in(batch)

    def example_batch(self, batch_size: int) -> Any:
        """``batch_size`` real items (repeated if the dataset is smaller; of a map-style one, :func:`spread_indices`), collated.

        Raises:
            BadData: Reading an item raised, or an iterable dataset yields nothing when iterated again: the
                data's fault, not the batch size's (a memory pre-pass must not take it for a limit of the batch).
        """
        from torch.utils.data import IterableDataset

        dataset = self.task.dataset
        items: list[Any] = []
        if isinstance(dataset, IterableDataset):
            try:
                while len(items) < batch_size:
                    before = len(items)
                    for item in dataset:
                        items.append(item)
                        if len(items) >= batch_size:
                            break
                    if len(items) == before and before:  # the data's fault at any batch: not a memory limit to halve
                        raise BadData(REITERATED)
                    if len(items) == before:
                        raise WorkloadError("the workload's dataset yields no items")
            except WorkloadError:
                raise
            except USER_CODE_ERRORS as exc:
                raise bad_item(exc, f"item {len(items)} of the workload's dataset") from None
        elif batched_read(dataset) is not None:  # read as the DataLoader reads it (a read that raises is BadData), then collated
            return read_batch(self.task, spread_indices(batch_size, len(dataset)))
        else:
            for index in spread_indices(batch_size, len(dataset)):
                try:
                    items.append(dataset[index])
                except USER_CODE_ERRORS as exc:
                    raise bad_item(exc, f"dataset[{index}]") from None
        return collate_items(self.task.collate, items)


def spread_indices(count: int, size: int) -> list[int]:
    """``count`` indices into a map-style dataset of ``size`` items: every item in turn where it holds no more, else
    spread evenly from its first item to its last. A dataset sorted by length holds its longest items at one end: a
    batch of its first items padded to the shortest, and the memory pre-pass and the compute-only ceiling measured a
    batch far lighter than the trials' (217 MiB against 434-555 MiB in a probe)."""
    if count >= size:
        return [index % size for index in range(count)]
    return [index * (size - 1) // max(1, count - 1) for index in range(count)]


class NamedItems(ItemsWrapper):
    """A map-style dataset whose item that raises in the trial's own process is :class:`BadData` naming it
    (``dataset[250] failed: ...``), as in :meth:`TaskPipeline.example_batch`: the data's fault, whichever run meets it
    first. In a loader worker the error stays itself: a dataset may fail only there (a connection that cannot be
    forked), the fault of the setups with workers, not of the data."""

    def failed(self, exc: BaseException, index: int) -> None:
        from torch.utils.data import get_worker_info  # here, not per item: the loader's hot path stays the dataset's

        if get_worker_info() is None:
            raise bad_item(exc, f"dataset[{index}]") from None


class NamedCollate:
    """A Task's collate, whose batch that cannot be collated in the trial's own process is :class:`WorkloadError`
    naming the item at fault, or each kind of item the batch mixes (``item 0: {meta: str}, item 9: {meta: NoneType}``),
    not PyTorch's ``TypeError`` naming no key: items that collate only in some mixes pass the search's check of the
    first ones and failed so in calibration. In a loader worker the error stays itself, as :class:`NamedItems`'s."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, batch: Any) -> Any:
        try:
            return self.collate(batch)
        except USER_CODE_ERRORS as exc:
            from torch.utils.data import get_worker_info

            from autotune.errors import is_out_of_memory, is_shm_full

            if not isinstance(batch, list) or get_worker_info() is not None or is_out_of_memory(exc) or is_shm_full(exc):
                raise
            collate_items(self.collate, batch, label="batch item")  # raises, naming the items (unless it now collates)
            raise


def open_pipeline(workload: Workload, decode: str = "cpu") -> Pipeline:
    """The pipeline of a workload: the user's Task, or the classifier shorthand
    (``decode="gpu"``: its loader yields file bytes, see :mod:`autotune.workloads.gpu_decode`).

    Raises:
        WorkloadError: The Task factory cannot be loaded.
    """
    if workload.task is not None:
        return TaskPipeline(workload)
    return ClassifierPipeline(workload, decode)


def endless_batches(
    setup: TrainSetup,
    dataset: Any,
    *,
    collate_fn: Callable[[list[Any]], Any] | None,
    seed: int,
    epochs: bool = False,
    clock: ProductionClock | None = None,
) -> Iterator[Any]:
    """The loader's batches, forever, with the setup's knobs.

    A map-style dataset is read through the endless sampler and never ends
    an epoch, as the emitted script reads it; with a ``clock`` its workers
    time each batch they make. An iterable dataset (or one
    without a length, ``epochs``) is looped pass by pass, each pass
    restarting the loader's pipeline, as the script does once per epoch; a
    pass that holds no full optimizer step (fewer batches than the setup's
    accumulation steps) ends the trial in error, as it stops the script.
    """
    import torch
    from torch.utils.data import IterableDataset

    from autotune.teardown import worker_dies_with_trial
    from autotune.workloads.data import InfiniteSampler

    extra: dict[str, Any] = {"drop_last": True, "worker_init_fn": worker_dies_with_trial}
    if collate_fn is not None:
        extra["collate_fn"] = collate_fn
    iterable = isinstance(dataset, IterableDataset)
    if not iterable and not epochs:
        sampler = InfiniteSampler(len(dataset), seed=seed)
        if clock is not None:
            dataset, extra["collate_fn"] = clock.wrap(dataset, collate_fn)
        return iter(setup.dataloader(dataset, sampler=sampler, **extra))
    if not iterable:
        generator = torch.Generator()
        generator.manual_seed(seed)
        extra.update(shuffle=True, generator=generator)
    loader = setup.dataloader(dataset, **extra)

    def forever() -> Iterator[Any]:
        steps, passes = setup.accumulation_steps, 0
        while True:
            count = 0
            for batch in loader:
                count += 1
                yield batch
            if not count and passes:  # not a batch too large for the stream: the calibration's halving must not read it so
                raise RuntimeError(REITERATED)
            if not count:
                share = ", or each loader worker's share of it does" if setup.num_workers > 1 else ""
                raise RuntimeError(f"the dataset yields no full batch of {setup.batch_size} samples (a pass holds fewer{share}): "
                                   "pass a smaller batch size (--batch-size; in Python, setup=autotune.TrainSetup(batch_size=...))")
            passes += 1
            if count < steps:  # the emitted script stops there too: its epochs would hold no optimizer step
                raise RuntimeError(f"the dataset {NO_FULL_STEP} of {setup.batch_size} x {steps} in one pass "
                                   f"({count} batch{'es' if count > 1 else ''} of {setup.batch_size}); train.py would stop in its first epoch")

    return forever()
