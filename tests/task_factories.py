"""Workload factories used by the tests as ``task_factories:NAME`` references."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import resource
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info

import autotune


def _pairs(n: int = 40) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=gen), torch.randint(0, 3, (n,), generator=gen))


class _Slowed(Dataset):
    """``dataset`` whose every item takes ``seconds`` longer to read."""

    def __init__(self, dataset: Dataset, seconds: float) -> None:
        self.dataset, self.seconds = dataset, seconds

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.seconds)
        return self.dataset[index]


#: The environment variable naming :func:`good`'s gate file.
GATE_ENV = "TASK_FACTORIES_GATE"


def in_a_trial() -> bool:
    """Whether this process is a trial (a child of the trial server) or one of a trial's loader workers."""
    import psutil

    process: psutil.Process | None = psutil.Process()
    for _ in range(3):
        try:
            process = process.parent() if process is not None else None
            if process is None:
                return False
            if "autotune.runner.server" in " ".join(process.cmdline()):
                return True
        except psutil.Error:
            return False
    return False


class _Gated(Dataset):
    """``dataset`` whose items wait, in trial processes only, while the file ``gate`` exists."""

    def __init__(self, dataset: Dataset, gate: str) -> None:
        self.dataset, self.gate = dataset, gate
        self.trial: bool | None = None  # read at the first item: the search's own checks read items too, ungated

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        if self.trial is None:
            self.trial = in_a_trial()
        while self.trial and os.path.exists(self.gate):
            time.sleep(0.02)
        return self.dataset[index]


def good() -> autotune.Task:
    """(inputs, targets) pairs, a linear model, the default cross-entropy. ``TASK_FACTORIES_SLOW_ITEM_S`` in the
    environment makes every item that much slower to read (a test's worker whose trials must last seconds to be seen
    running; the study's signature, which names the factory, stays the same). ``TASK_FACTORIES_GATE`` names a file
    while which a trial's items wait: its trial stays RUNNING until the test removes the file, however loaded the
    machine (the search's own checks of the Task, in its own process, read items ungated)."""
    slow = float(os.environ.get("TASK_FACTORIES_SLOW_ITEM_S", "0"))
    dataset: Dataset = _Slowed(_pairs(), slow) if slow else _pairs()
    gate = os.environ.get(GATE_ENV)
    return autotune.Task(nn.Linear(8, 3), _Gated(dataset, gate) if gate else dataset, batch_size=16, lr=2e-3)


def compiled() -> autotune.Task:
    """:func:`good`'s pieces with the model ``torch.compile`` wrapped by the factory (the eager backend: no inductor)."""
    return autotune.Task(torch.compile(nn.Linear(8, 3), backend="eager"), _pairs(), batch_size=16, lr=2e-3)


def slow_to_build() -> autotune.Task:
    """The good Task from a factory that takes ``TASK_FACTORIES_BUILD_S`` seconds (default 3), as one that loads or
    tokenizes a corpus does: every calibration run and trial builds it again."""
    time.sleep(float(os.environ.get("TASK_FACTORIES_BUILD_S", "3")))
    return good()


def chatty() -> autotune.Task:
    """The good Task from a factory that prints, as training scripts do."""
    print("loading the data")
    return good()


@dataclasses.dataclass(frozen=True)
class PairBatch:
    """A batch as a dataclass, as a collate_fn of one's own may return it."""

    x: torch.Tensor
    y: torch.Tensor


def dataclass_batches() -> autotune.Task:
    """The good Task's pairs collated into a PairBatch; a step() reads its fields."""
    return autotune.Task(
        lambda: nn.Linear(8, 3), _pairs(),
        collate_fn=lambda items: PairBatch(torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])),
        step=lambda model, batch: nn.functional.cross_entropy(model(batch.x), batch.y), batch_size=4)


#: A Task built at import, where a function that returns one belongs.
TASK = autotune.Task(nn.Linear(8, 3), _pairs(), batch_size=16)


def few() -> autotune.Task:
    """The good Task on 5 samples, fewer than its batch_size of 16."""
    return autotune.Task(nn.Linear(8, 3), _pairs(5), batch_size=16, lr=2e-3)


def _sgd(params: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def sgd() -> autotune.Task:
    """The good Task trained with SGD: its learning rate scales linearly."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size=16, lr=0.1, optimizer=_sgd)


class Items(Dataset):
    """20 dict items."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": torch.full((8,), float(index)), "y": index % 3}


def dict_batches() -> autotune.Task:
    """Dict items collated into a dict batch; a step() computes the loss."""
    return autotune.Task(
        lambda: nn.Linear(8, 3),
        Items(),
        step=lambda model, batch: nn.functional.cross_entropy(model(batch["x"]), batch["y"]),
        batch_size=4,
    )


class Stream(IterableDataset):
    """An iterable dataset of 24 pairs."""

    def __iter__(self) -> Any:
        for i in range(24):
            yield torch.full((8,), float(i)), i % 3


def iterable() -> autotune.Task:
    """An IterableDataset."""
    return autotune.Task(nn.Linear(8, 3), Stream())


class _Stream17(IterableDataset):  # type: ignore[type-arg]
    """17 pairs: at batch 16 the last batch holds one sample."""

    def __iter__(self) -> Any:
        for i in range(17):
            yield torch.full((8,), float(i)), i % 3


def iterable_batch_norm() -> autotune.Task:
    """A stream whose last batch at batch 16 is one sample, for a model with a BatchNorm layer."""
    return autotune.Task(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)), _Stream17(), batch_size=16)


def _tokens(batch: Any) -> int:
    return 10 * len(batch[1])  # ten tokens a sample


def iterable_batch_norm_counted_in_tokens() -> autotune.Task:
    """:func:`iterable_batch_norm`, its batches counted in tokens (batch_size_of): its lone last sample is 10 of them."""
    return autotune.Task(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)), _Stream17(), batch_size=16,
                         batch_size_of=_tokens)


def iterable_eval_batch_norm_without_statistics() -> autotune.Task:
    """The same stream for a BatchNorm in eval mode that keeps no running statistics: it uses the batch's, and fails on one sample."""
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.Linear(8, 3))
    model[1].eval()
    return autotune.Task(model, _Stream17(), batch_size=16)


def iterable_frozen_batch_norm() -> autotune.Task:
    """The same stream for a model whose BatchNorm its factory left in eval mode (a frozen layer's running statistics)."""
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    model[1].eval()
    return autotune.Task(model, _Stream17(), batch_size=16)


class SizedStream(Stream):
    """The 24 pairs of Stream, with a length (as webdataset's with_length() or a wrapper of a Hugging Face stream gives)."""

    def __len__(self) -> int:
        return 24


def sized_iterable() -> autotune.Task:
    """An IterableDataset with a __len__: still a stream (torch.utils.data.Dataset gives it a __getitem__ that raises)."""
    return autotune.Task(nn.Linear(8, 3), SizedStream(), batch_size=4)


class _Trillion(Dataset):  # type: ignore[type-arg]
    """10**12 items made from their index (a window at every position of a token corpus)."""

    def __len__(self) -> int:
        return 10**12

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((8,), float(index % 1000)), index % 3


def trillion_items() -> autotune.Task:
    """A map-style dataset too large for a permutation of its indices."""
    return autotune.Task(nn.Linear(8, 3), _Trillion(), batch_size=4)


class OneShotStream(IterableDataset):
    """24 pairs from an iterator made once, in __init__: the first pass uses it up, a second yields nothing."""

    def __init__(self) -> None:
        self.items = iter([(torch.full((8,), float(i)), i % 3) for i in range(24)])

    def __iter__(self) -> Any:
        return self.items


def one_shot_iterable() -> autotune.Task:
    """An IterableDataset that can be iterated once."""
    return autotune.Task(nn.Linear(8, 3), OneShotStream(), batch_size=4)


class ExitingStream(IterableDataset):
    """A stream whose __iter__ ends the interpreter (a script's guard run on import)."""

    def __iter__(self) -> Any:
        import sys

        sys.exit(4)
        yield  # pragma: no cover


def exiting_stream() -> autotune.Task:
    """An IterableDataset that calls sys.exit() when iterated."""
    return autotune.Task(nn.Linear(8, 3), ExitingStream())


class ShardedStream(IterableDataset):
    """The 24 pairs of Stream, split among loader workers with get_worker_info()."""

    def __iter__(self) -> Any:
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(first, 24, step):
            yield torch.full((8,), float(i)), i % 3


def sharded_iterable() -> autotune.Task:
    """An IterableDataset that shards itself among loader workers."""
    return autotune.Task(nn.Linear(8, 3), ShardedStream())


class AugmentedStream(IterableDataset):
    """The 24 pairs of Stream with random noise added as they are yielded (torch, ``random`` and NumPy draws)."""

    def __init__(self, sharded: bool = False) -> None:
        self.sharded = sharded

    def __iter__(self) -> Any:
        import random

        import numpy

        info = get_worker_info() if self.sharded else None
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(first, 24, step):
            jitter = random.random() + float(numpy.random.rand())
            yield torch.full((8,), float(i)) + torch.randn(8) + jitter, i % 3


class RandomStream(IterableDataset):
    """An endless stream of random samples (a throughput benchmark's data): no worker repeats another's."""

    def __iter__(self) -> Any:
        while True:
            yield torch.randn(8), int(torch.randint(0, 3, ()))


def random_iterable() -> autotune.Task:
    """An IterableDataset that generates its samples at random and does not shard itself (nothing to shard)."""
    return autotune.Task(nn.Linear(8, 3), RandomStream())


def augmented_iterable() -> autotune.Task:
    """An IterableDataset that augments randomly and does not shard itself."""
    return autotune.Task(nn.Linear(8, 3), AugmentedStream())


def augmented_sharded_iterable() -> autotune.Task:
    """An IterableDataset that augments randomly and shards itself among loader workers."""
    return autotune.Task(nn.Linear(8, 3), AugmentedStream(sharded=True))


def _two_groups(params: Any, lr: float) -> torch.optim.Optimizer:
    weight, bias = list(params)
    return torch.optim.SGD([{"params": [weight], "lr": lr}, {"params": [bias], "lr": lr * 0.01}], lr=lr)


def sgd_groups() -> autotune.Task:
    """SGD with two param groups at different learning rates."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size=16, lr=0.1, optimizer=_two_groups)


def _sgd_at_its_own_rate(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def sgd_own_rate() -> autotune.Task:
    """An optimizer factory that takes no lr= and sets 0.1 itself; Task.lr is left at its default."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size=16, optimizer=_sgd_at_its_own_rate)


def sgd_own_rate_beside_a_given_lr() -> autotune.Task:
    """The factory of :func:`sgd_own_rate`, and a Task given lr=1e-3 (the default's value, given): the factory's 0.1 wins."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size=16, lr=1e-3, optimizer=_sgd_at_its_own_rate)


class MyTask(autotune.Task):
    """A user's subclass of Task."""


def subclassed() -> autotune.Task:
    """The good Task, as an instance of a subclass."""
    return MyTask(nn.Linear(8, 3), _pairs(), batch_size=16, lr=2e-3)


def not_a_task() -> int:
    """Returns the wrong type."""
    return 3


def loss_and_step() -> autotune.Task:
    """A Task given both ways to compute the loss: refused by the Task itself."""
    return autotune.Task(model=lambda: nn.Linear(8, 2), dataset=_pairs(), loss=nn.functional.cross_entropy,
                         step=lambda model, batch: model(batch[0]).sum())


def raises() -> autotune.Task:
    """The factory itself fails."""
    raise RuntimeError("no data mounted")


def _no_model() -> nn.Module:
    raise RuntimeError("no weights mounted")


def model_fails() -> autotune.Task:
    """The factory returns a Task whose model factory fails (the Task refuses it as the model is built)."""
    return autotune.Task(model=_no_model, dataset=_pairs(), batch_size=16, lr=2e-3)


def not_an_optimizer() -> autotune.Task:
    """An optimizer factory that returns no optimizer (the Task refuses it as the optimizer is built)."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), optimizer=lambda params, lr: "adamw", batch_size=16, lr=2e-3)


def exits() -> autotune.Task:
    """The factory ends the interpreter, as a script's main guard might."""
    import sys

    sys.exit(3)


def empty() -> autotune.Task:
    """An empty dataset."""
    return autotune.Task(nn.Linear(8, 3), TensorDataset(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long)))


class _Odd(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> Any:
        return (torch.zeros(8), 0) if index != 1 else (object(), 0)


def uncollatable() -> autotune.Task:
    """Item 1 holds an object the default collate cannot batch."""
    return autotune.Task(nn.Linear(8, 3), _Odd())


class _NoneField(Dataset):  # type: ignore[type-arg]
    """Items whose metadata holds lists of different lengths, and for odd items a None."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> Any:
        return torch.zeros(8), 0, {"tags": ["a"] * (1 + index % 3), "source": None if index % 2 else "camera"}


def none_field() -> autotune.Task:
    """Item 1 fails to collate alone on its None; the batch fails first on the ragged lists of items 0 and 1."""
    return autotune.Task(nn.Linear(8, 3), _NoneField(), step=lambda model, batch: model(batch[0]).sum())


class _Corrupt(Dataset):  # type: ignore[type-arg]
    """The 40 pairs of ``_pairs()``, of which item 13 cannot be read (a corrupt record): found only when read."""

    def __init__(self) -> None:
        self.pairs = _pairs()

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> Any:
        if index == 13:
            raise ValueError("corrupt record 13")
        return self.pairs[index]


def corrupt_item() -> autotune.Task:
    """Item 13 of the data raises when read."""
    return autotune.Task(nn.Linear(8, 3), _Corrupt(), batch_size=8)


class _CorruptMidSecondEpoch(_Corrupt):
    """The 61st item read in a process (the 21st of the second epoch of 40, in its third micro-batch of 8, without
    loader workers; ``TASK_FACTORIES_CORRUPT_READ`` another) raises while the file ``TASK_FACTORIES_CORRUPT`` names
    exists: a record that goes bad mid-run, two steps after the first epoch's checkpoint; removing the file fixes it."""

    reads = 0

    def __getitem__(self, index: int) -> Any:
        self.reads += 1
        if self.reads == int(os.environ.get("TASK_FACTORIES_CORRUPT_READ", "61")) and os.path.exists(os.environ.get("TASK_FACTORIES_CORRUPT", "")):
            raise ValueError(f"corrupt record {index}")
        return self.pairs[index]


class _RankStream(IterableDataset):  # type: ignore[type-arg]
    """64 pairs, each rank of a torchrun job every world-th; rank 1's eleventh item of its second pass raises while the file
    ``TASK_FACTORIES_CORRUPT`` names exists (``passes`` counts them in this process: no loader workers)."""

    passes = 0

    def __iter__(self) -> Any:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        self.passes += 1
        for n, i in enumerate(range(rank, 64, world)):
            if rank == 1 and self.passes == 2 and n == 10 and os.path.exists(os.environ.get("TASK_FACTORIES_CORRUPT", "")):
                raise ValueError("corrupt record on rank 1")
            yield torch.full((8,), float(i)), i % 3


def rank_stream() -> autotune.Task:
    """An iterable dataset split by rank, whose rank 1 meets a corrupt record in its second pass (see _RankStream)."""
    return autotune.Task(nn.Linear(8, 3), _RankStream(), batch_size=4)


def corrupt_in_the_second_epoch() -> autotune.Task:
    """An item raises mid-way through the second epoch while ``TASK_FACTORIES_CORRUPT`` names a file that exists."""
    return autotune.Task(nn.Linear(8, 3), _CorruptMidSecondEpoch(), batch_size=8)


class _CorruptStream(IterableDataset):  # type: ignore[type-arg]
    """The 40 pairs of ``_pairs()`` as a stream that splits itself among loader workers; record 13 cannot be read."""

    def __iter__(self) -> Any:
        info = get_worker_info()
        pairs = _pairs()
        for index in range(info.id if info else 0, len(pairs), info.num_workers if info else 1):
            if index == 13:
                raise ValueError("corrupt record 13")
            yield pairs[index]


def large_items() -> autotune.Task:
    """64 items of 4096 values: a batch of 16 is 256 KiB, more than a 64 KiB /dev/shm holds."""
    return autotune.Task(nn.Linear(4096, 3), [(torch.zeros(4096), i % 3) for i in range(64)], batch_size=16)


def corrupt_stream() -> autotune.Task:
    """Record 13 of a stream raises when read."""
    return autotune.Task(nn.Linear(8, 3), _CorruptStream(), batch_size=8)


def ragged() -> autotune.Task:
    """Variable-length items without a collate_fn that pads them."""
    return autotune.Task(nn.Linear(8, 3), [(torch.zeros(3 + i % 5), 0) for i in range(8)])


def ragged_lists() -> autotune.Task:
    """Token-id lists of different lengths (not yet tensors) without a collate_fn that pads them."""
    return autotune.Task(nn.Linear(8, 3), [{"input_ids": list(range(3 + i % 5)), "labels": 0} for i in range(8)],
                         step=lambda model, batch: model(batch["input_ids"]).sum())


def non_scalar_loss() -> autotune.Task:
    """The loss keeps the batch dimension."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), loss=nn.CrossEntropyLoss(reduction="none"))


def frozen_model() -> autotune.Task:
    """Every parameter frozen: nothing to train."""
    model = nn.Linear(8, 3).requires_grad_(False)
    return autotune.Task(model, _pairs())


def detached_loss() -> autotune.Task:
    """The step detaches its loss from the graph."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]).detach())


def item_loss() -> autotune.Task:
    """The step returns the loss as a Python float (``.item()``), detached from its graph."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]).item())


def dict_loss() -> autotune.Task:
    """The step returns a dict holding the loss (as models with dict outputs do), not the loss."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=lambda model, batch: {"loss": nn.functional.cross_entropy(model(batch[0]), batch[1])})


def integer_loss() -> autotune.Task:
    """The step returns a count (an integer scalar), not a loss."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=lambda model, batch: (model(batch[0]).argmax(1) == batch[1]).sum())


def one_output_default_loss() -> autotune.Task:
    """A regression model (one output) left with the default cross-entropy: 0 over one class, nothing would train."""
    inputs = torch.randn(16, 8)
    return autotune.Task(nn.Linear(8, 1), TensorDataset(inputs, inputs.sum(1, keepdim=True)))


def broadcast_regression() -> autotune.Task:
    """A regression model (output [N, 1]) with MSELoss and targets [N]: the loss broadcast them into [N, N] and trained
    every output against every target of the batch, with PyTorch's one warning and a speedup reported as usual."""
    inputs = torch.randn(16, 8)
    return autotune.Task(nn.Linear(8, 1), TensorDataset(inputs, inputs.sum(1)), loss=nn.MSELoss())


def broadcast_step() -> autotune.Task:
    """The same broadcast inside the user's own step=: F.mse_loss of an [N, 1] output against [N] targets."""
    inputs = torch.randn(16, 8)
    return autotune.Task(nn.Linear(8, 1), TensorDataset(inputs, inputs.sum(1)),
                         step=lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]))


def shaped_regression() -> autotune.Task:
    """The same with targets [N, 1]: a good Task."""
    inputs = torch.randn(16, 8)
    return autotune.Task(nn.Linear(8, 1), TensorDataset(inputs, inputs.sum(1, keepdim=True)), loss=nn.MSELoss())


def multi_hot_default_loss() -> autotune.Task:
    """A multi-label model (rows of 0/1 targets, several 1s) left with the default cross-entropy: it trained without a
    word on unnormalised class probabilities; with BCEWithLogitsLoss it is a good Task."""
    gen = torch.Generator().manual_seed(0)
    return autotune.Task(nn.Linear(8, 5), TensorDataset(torch.randn(16, 8, generator=gen), (torch.rand(16, 5, generator=gen) > 0.4).float()))


class _UncertaintyWeighted(nn.Module):
    """Cross-entropy weighted by a learned log-variance, as losses with weights of their own (ArcFace heads, learned task
    weights) are."""

    def __init__(self) -> None:
        super().__init__()
        self.log_var = nn.Parameter(torch.zeros(()))

    def forward(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, targets) * torch.exp(-self.log_var) + self.log_var


class _Penalised(nn.Module):
    """Cross-entropy plus an L2 penalty on the model's weights: a loss that holds the model, whose parameters the optimizer
    trains."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, targets) + 1e-4 * sum(p.pow(2).sum() for p in self.net.parameters())


def penalised_loss() -> autotune.Task:
    """A good Task whose loss holds the model it penalises."""
    net = nn.Linear(8, 3)
    return autotune.Task(net, _pairs(), loss=_Penalised(net))


def learned_loss_own_optimizer() -> autotune.Task:
    """A loss with a trainable parameter that the Task's own optimizer factory adds: it trains."""
    loss = _UncertaintyWeighted()
    return autotune.Task(nn.Linear(8, 3), _pairs(), loss=loss, optimizer=lambda params, lr: torch.optim.AdamW([*params, *loss.parameters()], lr=lr))


def learned_loss() -> autotune.Task:
    """A loss with a trainable parameter: the optimizer gets the model's parameters only, so it never trained."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), loss=_UncertaintyWeighted())


class _Checkpointed(nn.Module):
    """A model whose second layer runs under reentrant activation checkpointing (Hugging Face's default), which
    torch.autograd.grad refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.second, self.first(inputs), use_reentrant=True)


def reentrant_checkpoint() -> autotune.Task:
    """A good Task whose model checkpoints a layer reentrantly."""
    return autotune.Task(_Checkpointed, _pairs())


_GLOBAL_NET = nn.Linear(8, 3)


def step_with_another_model() -> autotune.Task:
    """A step that computes its loss with a global model, not the one it is given: the trials trained nothing of it."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=lambda model, batch: nn.functional.cross_entropy(_GLOBAL_NET(batch[0]), batch[1]))


def regression_default_loss() -> autotune.Task:
    """Three float targets per sample, shaped as the output, left with the default cross-entropy: it trained on them as
    class probabilities without a word (train.py printed negative losses); with MSELoss it is a good Task."""
    gen = torch.Generator().manual_seed(0)
    return autotune.Task(nn.Linear(8, 3), TensorDataset(torch.randn(16, 8, generator=gen), torch.randn(16, 3, generator=gen)))


def soft_labels() -> autotune.Task:
    """Float targets that are probabilities summing to 1 (label smoothing, mixup): the default cross-entropy takes them."""
    gen = torch.Generator().manual_seed(0)
    return autotune.Task(nn.Linear(8, 5), TensorDataset(torch.randn(16, 8, generator=gen), torch.full((16, 5), 0.2)))


class _NanLoss(nn.Module):
    def forward(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return output.sum() * float("nan")


def nan_loss() -> autotune.Task:
    """The loss is NaN from the first batch on."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), loss=_NanLoss())


def _nan_weights_step(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    # sqrt at 0: the loss stays finite, its gradient does not (inf x 0), and the optimizer's step makes the weights NaN.
    return nn.functional.cross_entropy(model(inputs), targets) + torch.sqrt((model.weight * 0).sum())


def nan_weights() -> autotune.Task:
    """Every step's loss is finite; the first optimizer step makes the weights NaN."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=_nan_weights_step)


class _NanStatistics(nn.Linear):
    """A running statistic (a float buffer) turns NaN while the loss and the weights stay finite."""

    def __init__(self) -> None:
        super().__init__(8, 3)
        self.register_buffer("running", torch.zeros(3))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.running.fill_(float("nan"))
        return super().forward(inputs)


def nan_buffer() -> autotune.Task:
    """Every step's loss and every weight are finite; a float buffer is NaN from the first step."""
    return autotune.Task(_NanStatistics(), _pairs())


class _MaskedLinear(nn.Linear):
    """A buffer of -inf on purpose, as an attention mask: nothing is wrong with this model's state."""

    def __init__(self) -> None:
        super().__init__(8, 3)
        self.register_buffer("mask", torch.full((3,), float("-inf")))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return super().forward(inputs) + self.mask.exp()  # exp(-inf) = 0


def inf_mask_buffer() -> autotune.Task:
    """A model whose -inf buffer is a mask: it trains, and its checkpoints are written."""
    return autotune.Task(_MaskedLinear(), _pairs())


def _not_a_count(batch: Any) -> int:
    return "x"  # type: ignore[return-value]


def bad_count() -> autotune.Task:
    """batch_size_of returns text."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size_of=_not_a_count)


def fractional_count() -> autotune.Task:
    """batch_size_of returns a float."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size_of=lambda batch: 3.7)


def tensor_count() -> autotune.Task:
    """batch_size_of returns an integer 0-d tensor (a mask's sum): that counts."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size_of=lambda batch: (batch[1] >= 0).sum())


def numpy_count() -> autotune.Task:
    """batch_size_of returns a NumPy integer (np.sum of a mask): that counts."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size_of=lambda batch: np.sum(batch[1].numpy() >= 0))


def zero_count() -> autotune.Task:
    """batch_size_of counts nothing."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size_of=_count_nothing)


def _count_nothing(batch: Any) -> int:
    return 0


class _LenRaises(TensorDataset):
    def __len__(self) -> int:
        raise TypeError("no len")


def len_raises() -> autotune.Task:
    """A map-style dataset whose __len__ raises."""
    return autotune.Task(nn.Linear(8, 3), _LenRaises(torch.randn(4, 8), torch.zeros(4, dtype=torch.long)))


def _images_and_targets(items: list[Any]) -> Any:
    return tuple(zip(*items, strict=True))  # torchvision's detection references: (images, targets) as tuples of the items


def _detection_step(model: nn.Module, batch: Any) -> torch.Tensor:
    images, targets = batch
    losses = [nn.functional.cross_entropy(model(image).unsqueeze(0), target.view(1)) for image, target in zip(images, targets, strict=True)]
    return torch.stack(losses).mean()


def listed_batches() -> autotune.Task:
    """Batches of tuples of items: the first tensor's first dimension is an item's (8 features), not a count of items."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=_detection_step, collate_fn=_images_and_targets)


def _sentences() -> list[tuple[torch.Tensor, int]]:
    return [(torch.arange(1, 3 + (i * 5) % 11), i % 2) for i in range(40)]  # lengths 2 to 12, the first item among the shortest


def _sequence_first(items: list[Any]) -> Any:
    sequences, labels = zip(*items, strict=True)
    return nn.utils.rnn.pad_sequence(list(sequences)), torch.tensor(labels)  # [length, batch], pad_sequence's default


class _SequenceFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(0))


def sequence_first() -> autotune.Task:
    """Padded [length, batch] token batches: the first dimension is the longest item's length, which grows with the items."""
    return autotune.Task(_SequenceFirst, _sentences(), collate_fn=_sequence_first)


def length_sorted() -> autotune.Task:
    """Token sequences sorted by length, as a corpus bucketed for padding is (item i holds i + 2 tokens), padded [length,
    batch] and counted by items."""
    ordered = sorted(_sentences() + [(torch.arange(1, 3 + i) % 15 + 1, i % 2) for i in range(40)], key=lambda item: len(item[0]))
    return autotune.Task(_SequenceFirst, ordered, collate_fn=_sequence_first, batch_size_of=lambda batch: batch[0].shape[1])


def sequence_first_counted() -> autotune.Task:
    """The same, with batch_size_of counting the items."""
    return autotune.Task(_SequenceFirst, _sentences(), collate_fn=_sequence_first, batch_size_of=lambda batch: batch[0].shape[1])


def listed_batches_counted() -> autotune.Task:
    """The same, with batch_size_of counting the items."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=_detection_step, collate_fn=_images_and_targets,
                         batch_size_of=lambda batch: len(batch[0]))


def _step_with_backward(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    return loss


def calls_backward() -> autotune.Task:
    """A step that calls backward() itself (the trial calls it again)."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=_step_with_backward)


def _step_with_retained_backward(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward(retain_graph=True)  # the graph kept: a second backward raises nothing, it doubles the gradients
    return loss


def calls_backward_retaining() -> autotune.Task:
    """A step that calls backward(retain_graph=True) itself: the trial's own backward would succeed and double it."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=_step_with_retained_backward)


class _WithUnusedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 3)
        self.unused = nn.Linear(3, 3)  # requires grad, never called: DDP waits for its gradient

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.body(inputs)


def unused_parameter() -> autotune.Task:
    """A model with a parameter its forward never uses."""
    return autotune.Task(_WithUnusedHead(), _pairs(), batch_size=4)


def batch_norm() -> autotune.Task:
    """A model with a BatchNorm1d, which cannot train on a batch of one sample."""
    return autotune.Task(nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)), _pairs(), batch_size=4)


def needs_arguments(n: int, m: int) -> autotune.Task:
    """A factory whose arguments have no defaults (called with none)."""
    return autotune.Task(nn.Linear(8, 3), _pairs(n + m))


def forward_fails() -> autotune.Task:
    """The model expects 5 features; the data has 8."""
    return autotune.Task(nn.Linear(5, 3), _pairs())


class _Float64Items(Dataset):
    """NumPy's default dtype: float64 arrays, with int labels."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> Any:
        return np.random.RandomState(index).randn(3, 8, 8), index % 2


def float64_items() -> autotune.Task:
    """float64 items for a float32 Conv2d (the forward fails), and for a float32 Linear through a step."""
    return autotune.Task(nn.Conv2d(3, 2, 3), _Float64Items(), loss=lambda out, y: out.mean())


def float64_items_step() -> autotune.Task:
    return autotune.Task(nn.Sequential(nn.Flatten(), nn.Linear(192, 2)), _Float64Items(),
                         step=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]))


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 3), nn.Linear(4, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.a(a) + self.b(b)


class _MaskedInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _TwoInputs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)  # the submodule's second input forgotten: the user's bug, not a model of two inputs


def masked_inside() -> autotune.Task:
    """One input, passed on to a submodule that takes two."""
    return autotune.Task(_MaskedInside(), [(torch.zeros(8), i % 3) for i in range(8)], loss=nn.CrossEntropyLoss())


def two_inputs() -> autotune.Task:
    """A model of two inputs given loss=, whose batches hold the inputs as a pair: the model is called with the pair."""
    return autotune.Task(_TwoInputs(), [((torch.zeros(8), torch.zeros(4)), i % 3) for i in range(8)], loss=nn.CrossEntropyLoss())


class _DetectorLike(nn.Module):
    """forward(images, targets=None) as torchvision's detectors: training asserts on targets it was not given."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 3)

    def forward(self, images: torch.Tensor, targets: list[dict[str, torch.Tensor]] | None = None) -> dict[str, torch.Tensor]:
        if self.training:
            assert targets is not None, "targets should not be none when in training mode"
        return {"loss": self.head(images).sum()}


def detector_loss() -> autotune.Task:
    """A detector-like model given loss=: called with the images alone, its forward asserts on the missing targets."""
    return autotune.Task(_DetectorLike(), [(torch.zeros(8), i % 3) for i in range(8)], loss=lambda out, targets: out["loss"])


class _Masked(nn.Module):
    """forward(x, mask=None) whose layer takes 16 features, fed 8: a shape bug of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(x)


def masked_shape_bug() -> autotune.Task:
    """A model with an optional second argument that fails for its own reason: not told to use step=."""
    return autotune.Task(_Masked(), [(torch.zeros(8), i % 3) for i in range(8)], loss=nn.CrossEntropyLoss())


class _WithAuxiliary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head, self.aux = nn.Linear(8, 3), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(x), self.aux(x)


def tuple_output() -> autotune.Task:
    """A model that returns (logits, auxiliary logits), given loss= that takes one tensor."""
    return autotune.Task(_WithAuxiliary(), _pairs(), loss=nn.CrossEntropyLoss())


def tuple_output_default_loss() -> autotune.Task:
    """The same model with the default loss (cross-entropy), which takes one tensor."""
    return autotune.Task(_WithAuxiliary(), _pairs())


class _Out(NamedTuple):
    logits: torch.Tensor
    aux: torch.Tensor


class _NamedOutputs(_WithAuxiliary):
    def forward(self, x: torch.Tensor) -> _Out:  # type: ignore[override]
        return _Out(self.head(x), self.aux(x))


def namedtuple_output_default_loss() -> autotune.Task:
    """The model's outputs as a namedtuple, with the default loss."""
    return autotune.Task(_NamedOutputs(), _pairs())


class _HoldsFile(Dataset):
    def __init__(self) -> None:
        self.handle = tempfile.TemporaryFile()
        self.data = _pairs()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        return self.data[index]


def unpicklable() -> autotune.Task:
    """A dataset that opens a file handle in __init__."""
    return autotune.Task(nn.Linear(8, 3), _HoldsFile())


class _FailsInWorkers(Dataset):
    def __init__(self) -> None:
        self.data = _pairs()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        if get_worker_info() is not None:
            raise OSError("the database connection cannot be used in a forked worker")
        return self.data[index]


def fails_in_workers() -> autotune.Task:
    """Loads fine in the main process, fails in every loader worker."""
    return autotune.Task(nn.Linear(8, 3), _FailsInWorkers(), batch_size=8)


class _CorruptRecord(Dataset):
    def __init__(self, error: Exception) -> None:
        self.data = _pairs(300)
        self.error = error

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        if index == 250:
            raise self.error
        return self.data[index]


def corrupt_record() -> autotune.Task:
    """Item 250 of 300 raises: past the check's first items and the pre-pass's first batches."""
    return autotune.Task(nn.Linear(8, 3), _CorruptRecord(ValueError("corrupt record 250\n(at byte 4096)")), batch_size=8)


def record_out_of_memory() -> autotune.Task:
    """Item 250 of 300 runs out of memory: the batch's doing, maybe, not the data's."""
    return autotune.Task(nn.Linear(8, 3), _CorruptRecord(MemoryError("cannot allocate the decoded record")), batch_size=8)


#: Where :func:`crash_rank_one` records the pid of every rank that trained: one directory per checkout, so that two
#: test runs of two checkouts on one machine (CI's and the README's command) do not count each other's ranks.
RANK_PIDS = Path(tempfile.gettempdir()) / f"autotune-test-rank-pids-{hashlib.sha1(str(Path(__file__).resolve()).encode()).hexdigest()[:10]}"


def no_core_dump() -> None:
    """No core dump of this process when it crashes: a core limit of 0 does not stop a dump piped to a handler (apport,
    systemd-coredump), which can take seconds under load, so not dumpable at all (prctl PR_SET_DUMPABLE 0) as well."""
    import ctypes

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def _crash_rank_one_step(model: nn.Module, batch: Any) -> torch.Tensor:
    rank = os.environ.get("RANK")
    if rank is not None:
        RANK_PIDS.mkdir(exist_ok=True)
        (RANK_PIDS / str(os.getpid())).touch()
        if rank == "1" and len(list(RANK_PIDS.iterdir())) >= 2:
            no_core_dump()
            os.kill(os.getpid(), signal.SIGSEGV)
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


def crash_rank_one() -> autotune.Task:
    """The good Task whose rank 1 dies of SIGSEGV once both ranks trained (pids recorded in RANK_PIDS)."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=_crash_rank_one_step, batch_size=4)


def lazy_modules() -> autotune.Task:
    """A model of lazy modules (their parameters take their shapes from the first forward) on image batches."""
    images = TensorDataset(torch.randn(12, 3, 6, 6), torch.arange(12) % 3)
    return autotune.Task(lambda: nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.Flatten(), nn.LazyLinear(3)),
                         images, batch_size=4)


def lazy_modules_stream() -> autotune.Task:
    """A lazy module over an iterable dataset."""
    return autotune.Task(lambda: nn.LazyLinear(3), Stream())


#: torch's intra-op thread count at each step of :func:`sets_its_threads` (in this process).
THREADS_SEEN: list[int] = []


def _threads_step(model: nn.Module, batch: Any) -> torch.Tensor:
    THREADS_SEEN.append(torch.get_num_threads())
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


def sets_its_threads() -> autotune.Task:
    """A factory that sets torch's thread count itself, as training scripts often do at their top."""
    torch.set_num_threads(1)
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=_threads_step, batch_size=4)


def _still_backbone(params: Any) -> torch.optim.Optimizer:
    weight, bias = list(params)
    return torch.optim.SGD([{"params": [weight], "lr": 0.0}, {"params": [bias], "lr": 0.1}], momentum=0.9)


def frozen_by_rate() -> autotune.Task:
    """An optimizer factory without lr= whose first param group trains at rate 0 (a backbone held still)."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size=16, optimizer=_still_backbone)


def _all_still(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.0)


def still_everywhere() -> autotune.Task:
    """An optimizer factory that sets rate 0 in every group."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), batch_size=16, optimizer=_all_still)


class _SlowItems(Dataset):  # type: ignore[type-arg]
    """Each item takes 20 ms to read: a worker makes a batch of 32 in 0.64 s at best."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import time

        time.sleep(0.02)
        return torch.zeros(8), index % 2


def _step_at_500_per_s(model: nn.Module, batch: Any) -> torch.Tensor:
    import time

    inputs, targets = batch
    time.sleep(0.002 * len(targets))  # the training step consumes 500 samples/s at most
    return nn.functional.cross_entropy(model(inputs), targets)


def slow_loader() -> autotune.Task:
    """A step (500 samples/s) faster than 8 workers make batches (400 samples/s at most)."""
    return autotune.Task(nn.Linear(8, 2), _SlowItems(), step=_step_at_500_per_s, batch_size=32)


class _BatchedDict(Dataset):  # type: ignore[type-arg]
    """A dataset read a batch at a time, as many tabular and Hugging Face datasets are: ``__getitems__`` returns one dict
    of stacked tensors (``__getitem__``, which a DataLoader then never calls, returns a pair)."""

    def __init__(self) -> None:
        self.inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.inputs[index], 0

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        rows = self.inputs[indices]
        return {"x": rows, "y": (rows.sum(1) > 0).long()}


def _dict_to_pair(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch["x"], batch["y"]


def batched_reads() -> autotune.Task:
    """A dataset whose own batched read returns a dict, which its collate_fn turns into (inputs, targets)."""
    return autotune.Task(nn.Linear(8, 2), _BatchedDict(), collate_fn=_dict_to_pair, batch_size=16)


def batched_reads_lazy() -> autotune.Task:
    """:func:`batched_reads` with a lazy module, shaped by a first forward on what the batched read returns."""
    return autotune.Task(nn.LazyLinear(2), _BatchedDict(), collate_fn=_dict_to_pair, batch_size=16)


def corrupt_record_subset() -> autotune.Task:
    """:func:`corrupt_record` through a Subset, whose own ``__getitems__`` the DataLoader (and the check) reads."""
    from torch.utils.data import Subset

    dataset = _CorruptRecord(ValueError("corrupt record 250\n(at byte 4096)"))
    return autotune.Task(nn.Linear(8, 3), Subset(dataset, range(len(dataset))), batch_size=8)


class _VideoAndImage(nn.Module):
    """A clip through Conv3d (5-D weights) beside an image through Conv2d: channels_last acts on the image batch and
    cannot convert the model."""

    def __init__(self) -> None:
        super().__init__()
        self.clip = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.AdaptiveAvgPool3d(1), nn.Flatten())
        self.image = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 3)

    def forward(self, clip: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.clip(clip), self.image(image)], 1))


def video_and_image() -> autotune.Task:
    """Batches of (clip, image) pairs and labels; a model channels_last cannot hold."""
    clips, images = torch.randn(16, 3, 2, 4, 4), torch.randn(16, 3, 4, 4)
    data = TensorDataset(clips, images, torch.arange(16) % 3)
    return autotune.Task(_VideoAndImage, data, batch_size=4,
                         step=lambda model, batch: nn.functional.cross_entropy(model(batch[0], batch[1]), batch[2]))



def _pairs_in(dtype: torch.dtype) -> TensorDataset:
    inputs, targets = _pairs().tensors
    return TensorDataset(inputs.to(dtype), targets)


def float64() -> autotune.Task:
    """A float64 model on float64 inputs: CPU autocast leaves it alone, so amp=bf16 would compute as amp=off."""
    return autotune.Task(lambda: nn.Linear(8, 3).double(), _pairs_in(torch.float64), batch_size=16, lr=2e-3)


def bfloat16() -> autotune.Task:
    """A bfloat16 model: an autocast to bf16 computes its loss in float32; fp16's GradScaler cannot unscale its gradients."""
    return autotune.Task(lambda: nn.Linear(8, 3).to(torch.bfloat16), _pairs_in(torch.bfloat16), batch_size=16, lr=2e-3)


class _HalfHead(nn.Module):
    """A float32 layer, then a float16 one (its output back in float32 for the loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 3).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).half()).float()


def half_and_single() -> autotune.Task:
    """A model with a float16 layer beside a float32 one: an autocast acts on the float32 one."""
    return autotune.Task(_HalfHead, _pairs(), batch_size=16, lr=2e-3)


def _triples() -> TensorDataset:
    inputs, targets = _pairs().tensors
    return TensorDataset(inputs, targets, targets)


def triples() -> autotune.Task:
    """(inputs, targets, weights) items and no loss=: the default loss takes pairs."""
    return autotune.Task(nn.Linear(8, 3), _triples(), batch_size=16)


def triples_with_loss() -> autotune.Task:
    """The same with a loss= of the user's."""
    return autotune.Task(nn.Linear(8, 3), _triples(), loss=nn.CrossEntropyLoss(), batch_size=16)


class _FineTuned(nn.Module):
    """A fine-tuning recipe's model: a backbone frozen and in eval mode (its BatchNorm keeps the pretrained statistics),
    a head that trains, with a dropout in training mode under it."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(4, 3))
        self.backbone.requires_grad_(False)
        self.backbone.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


FINE_TUNED: list[_FineTuned] = []


def _fine_tuned() -> _FineTuned:
    model = _FineTuned()
    FINE_TUNED.append(model)
    return model


def frozen_backbone() -> autotune.Task:
    """A Task whose factory leaves the frozen backbone in eval mode (FINE_TUNED holds each model it built)."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(32, 3, 8, 8, generator=gen) * 3 + 2
    return autotune.Task(_fine_tuned, TensorDataset(images, torch.randint(0, 3, (32,), generator=gen)), batch_size=4)


class _UnevenShards(IterableDataset):  # type: ignore[type-arg]
    """A stream split by torchrun rank whose shards differ in length: rank 0's holds 48 pairs, the others' 24."""

    def __iter__(self) -> Any:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        for i in range(48 if rank == 0 else 24):
            yield torch.full((8,), float(i)), i % 3


def uneven_shards() -> autotune.Task:
    """An IterableDataset whose torchrun ranks yield 12 and 6 batches of 4 per epoch."""
    return autotune.Task(nn.Linear(8, 3), _UnevenShards(), batch_size=4)


def meant_broadcast_step() -> autotune.Task:
    """A step whose extra term pulls every output row toward one constant row ([N, 3] against [3]): PyTorch warns of
    the broadcast, which keeps the output's shape and is meant."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), step=lambda model, batch: nn.functional.cross_entropy(
        out := model(batch[0]), batch[1]) + 0.01 * nn.functional.mse_loss(out, torch.zeros(3)))


def loss_by_position() -> autotune.Task:
    """The loss passed by position, as a training loop's criterion often is."""
    return autotune.Task(nn.Linear(8, 3), _pairs(), nn.CrossEntropyLoss())  # type: ignore[misc]


def with_sampler() -> autotune.Task:
    """A recipe's WeightedRandomSampler passed to the Task, which has none."""
    data = _pairs()
    return autotune.Task(nn.Linear(8, 3), data, sampler=torch.utils.data.WeightedRandomSampler([1.0] * len(data), len(data)))  # type: ignore[call-arg]


class _Texts(Dataset):  # type: ignore[type-arg]
    """Token ids of 3 to 9 tokens with a label, as PyTorch's text-classification tutorial reads them."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.arange(3 + i % 7) % 50, i % 3


def _bag_collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    texts = [text for text, _ in items]
    offsets = torch.tensor([0] + [len(t) for t in texts[:-1]]).cumsum(0)
    return torch.cat(texts), offsets, torch.tensor([label for _, label in items])


class _Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag, self.head = nn.EmbeddingBag(50, 8), nn.Linear(8, 3)

    def forward(self, text: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(text, offsets))


def _bag_step(model: nn.Module, batch: Any) -> torch.Tensor:
    text, offsets, labels = batch
    return nn.functional.cross_entropy(model(text, offsets), labels)


def tokens_joined(count: bool = False) -> autotune.Task:
    """The tutorial's EmbeddingBag batch: every item's tokens joined into one tensor, with offsets (``count``: and the
    items counted by the labels)."""
    return autotune.Task(_Bag, _Texts(), collate_fn=_bag_collate, step=_bag_step, batch_size=8,
                         batch_size_of=(lambda batch: len(batch[-1])) if count else None)


def tokens_joined_counted() -> autotune.Task:
    return tokens_joined(count=True)


def views_stacked() -> autotune.Task:
    """A contrastive recipe's batch: two views of every item stacked along the first dimension."""
    def collate(items: list[Any]) -> torch.Tensor:
        inputs = torch.stack([x for x, _ in items])
        return torch.cat([inputs, inputs + 0.1])

    return autotune.Task(nn.Linear(8, 4), _pairs(), collate_fn=collate, batch_size=8,
                         step=lambda model, batch: model(batch).pow(2).mean())


class _ReadsWithTorchvisionIO(Dataset):  # type: ignore[type-arg]
    """PNG files read with torchvision.io.read_file and decoded with decode_image, as many users' datasets read them."""

    def __init__(self) -> None:
        from PIL import Image

        self.root = Path(tempfile.gettempdir()) / "autotune-tvio-pngs"  # written once, shared by every trial's call
        self.root.mkdir(exist_ok=True)
        for i in range(32):
            if not (self.root / f"{i}.png").exists():
                part = self.root / f"{i}.{os.getpid()}.part"
                Image.new("RGB", (16, 16), (i * 7 % 256, 40, 90)).save(part, format="PNG")
                part.replace(self.root / f"{i}.png")  # whole, also when trials write them at once

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import decode_image, read_file

        return decode_image(read_file(str(self.root / f"{i}.png"))).float() / 255, i % 3


def reads_with_torchvision_io() -> autotune.Task:
    return autotune.Task(nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)),
                         _ReadsWithTorchvisionIO(), batch_size=8)
