"""The public record of a user's training workload: :class:`Task`.

A workload factory (``mypkg.train:make_task``) is a function without required
arguments that returns a Task; autotune imports and calls it in every trial
process and in the emitted ``train.py``::

    import torch
    from torch import nn

    import autotune


    def make_task() -> autotune.Task:
        return autotune.Task(
            model=MyNet,                      # an nn.Module or a zero-argument factory of one
            dataset=MyDataset("train.csv"),   # any map-style (or iterable) torch Dataset
            loss=nn.CrossEntropyLoss(),       # loss(model(inputs), targets) for (inputs, targets) batches
            batch_size=64,                    # the recipe: the reference effective batch
            lr=3e-4,                          # the learning rate at that batch
        )

Batches that are not ``(inputs, targets)`` pairs use ``step(model, batch)``
instead of ``loss``: it returns the scalar loss of one batch (autotune does
the backward pass, the optimizer step, autocast and accumulation).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import USER_CODE_ERRORS, WorkloadError
from autotune.units import as_float
from autotune.workloads.batches import describe_batch, first_dim, tensors
from autotune.workloads.optimizer_factory import FilledRate, default_rate, first_rate, needs_closure, passes_its_own_lr

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["Task"]


#: torch.optim classes (and their subclasses) whose learning rate follows the square-root rule.
ADAPTIVE_OPTIMIZERS = frozenset(
    {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "SparseAdam", "Adafactor"}
)
#: A class name holding one of these (any case) names an adaptive optimizer of another library: an Adam variant
#: (AdamW8bit, FusedAdam, PagedAdamW), LAMB (whose paper scales its rate by the square root) or AdaBelief.
ADAPTIVE_NAME_PARTS = ("adam", "lamb", "adabelief")
#: torch.optim classes whose step does not follow the gradient's scale: no batch rule applies, the rate is kept.
KEPT_RATE_OPTIMIZERS = frozenset({"Rprop", "LBFGS", "Muon"})
#: A class name holding one of these (any case) names such an optimizer of another library: sign-based (Lion, signSGD,
#: Signum), orthogonalized (Muon) or parameter-free, whose ``lr`` is a multiplier near 1 (Prodigy, D-Adaptation: DAdaptAdam).
KEPT_RATE_NAME_PARTS = ("lion", "signsgd", "signum", "muon", "prodigy", "dadapt")


@dataclass(frozen=True)
class Task:
    """What the user trains: model, data, loss or step, optimizer, recipe.

    Attributes:
        model: An ``nn.Module``, or a zero-argument callable returning one
            (called once per trial, so each trial starts from fresh weights).
        dataset: A ``torch.utils.data.Dataset``. Map-style datasets get every
            knob; iterable datasets get the loader knobs but no endless
            sampler, no epoch-size cap and no per-worker sharding (their own
            ``__iter__`` must shard with ``get_worker_info()``).
        loss: A criterion applied as ``loss(model(inputs), targets)`` to
            ``(inputs, targets)`` batches (an ``nn.Module``'s own tensors, such
            as a class ``weight``, follow the model's output to its device).
            Default: cross-entropy when ``step`` is not given either.
        step: ``step(model, batch) -> loss`` for any other batch (dicts,
            several inputs, outputs that are dicts). Exactly one of ``loss``
            and ``step`` may be given.
        collate_fn: The DataLoader's ``collate_fn`` (padding, dict batches).
        optimizer: A factory ``params -> torch.optim.Optimizer``; it is
            called with ``lr=`` when it accepts that argument (the rate
            scaled to the tuned effective batch). A factory without ``lr``
            (or a ``functools.partial`` that binds it) sets its own rates: its first param group's (not at 0) is then the recipe's
            rate (``lr`` is not used), and every group's is scaled by the
            same ratio. Default: AdamW at ``lr`` with the tuned
            ``optimizer_impl`` (a factory of your own is not given that knob).
        batch_size: The recipe's batch: the reference effective batch for the
            learning-rate note and the batch of the "recipe" baseline (per
            process under DDP trials, whose reference is then the world's).
        lr: The recipe's learning rate at ``batch_size`` (see ``optimizer``). Default (``None``): the optimizer factory's
            own default where its signature gives one (``def make(params, lr=0.05)``, ``optimizer=torch.optim.SGD``),
            else 1e-3, AdamW's.
        batch_size_of: ``batch_size_of(batch) -> int``: samples in a batch
            (default: the first dimension of the batch's first tensor). Return
            tokens to measure tokens/s.
    """

    model: Any
    dataset: Any
    _: KW_ONLY
    loss: Callable[..., Any] | None = None
    step: Callable[[Any, Any], Any] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    optimizer: Callable[..., Any] | None = None
    batch_size: int = 32
    lr: float = None  # type: ignore[assignment]  # None (the default) is resolved in __post_init__: a float after it, always
    batch_size_of: Callable[[Any], int] | None = None

    def __post_init__(self) -> None:
        if self.loss is not None and self.step is not None:
            raise WorkloadError("Task takes loss= or step=, not both")
        if not callable(self.model):  # an nn.Module is callable too; None was refused only when a search checked the Task
            raise WorkloadError(f"Task model must be an nn.Module or a factory of one, got {type(self.model).__name__}")
        if self.dataset is None:
            raise WorkloadError("Task dataset must be a torch.utils.data.Dataset, got None")
        if isinstance(self.dataset, type):  # dataset=TensorDataset: "object of type 'type' has no len()" after the probe
            raise WorkloadError(f"Task dataset is the class {self.dataset.__name__}, not a dataset: pass an instance "
                                f"(dataset={self.dataset.__name__}(...))")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, numbers.Integral) or self.batch_size < 1:
            raise WorkloadError(f"Task batch_size must be an integer >= 1, got {self.batch_size!r}")
        object.__setattr__(self, "_lr_given", self.lr is not None and not isinstance(self.lr, FilledRate))  # said where a factory's own differs
        if self.lr is None:
            object.__setattr__(self, "lr", default_rate(self.optimizer))
        if type(self.lr).__name__ == "Tensor" and getattr(self.lr, "ndim", None) == 0:  # lr=torch.tensor(1e-3): a number too
            object.__setattr__(self, "lr", self.lr.item())
        if isinstance(self.lr, bool) or not isinstance(self.lr, numbers.Real) or not 0 < self.lr < math.inf:
            raise WorkloadError(f"Task lr must be a finite number > 0, got {self.lr!r}")
        # NumPy's numbers (a config read with NumPy) as Python's: best.json and the emitted script write them as JSON.
        object.__setattr__(self, "batch_size", int(self.batch_size))
        object.__setattr__(self, "lr", self.lr if isinstance(self.lr, FilledRate) else as_float(self.lr))  # NumPy's float32 3e-4 as 3e-4
        for name in ("loss", "step", "collate_fn", "optimizer", "batch_size_of"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                factory = " (a factory: optimizer=lambda params: torch.optim.SGD(params, lr=0.1), built over each trial's model)"
                raise WorkloadError(f"Task {name} must be callable, got {type(value).__name__}"
                                    + (factory if name == "optimizer" and hasattr(value, "param_groups") else ""))
        if isinstance(self.loss, type):  # loss=nn.MSELoss: called on (output, targets) it would build a criterion, not a loss
            name = self.loss.__name__
            raise WorkloadError(f"Task loss is the class {name}, not a loss function: pass an instance (loss={name}())")
        if isinstance(self.dataset, (tuple, dict)) and self.collate_fn is None:
            _refuse_tensor_columns(self.dataset)

    # -------------------------------------------------------------- building
    def build_model(self) -> torch.nn.Module:
        """The model: ``model`` itself, or what its factory returns.

        Raises:
            WorkloadError: The factory fails or returns no ``nn.Module``, or one whose ``to()`` returns something else.
        """
        import torch

        model = self.model
        if not isinstance(model, torch.nn.Module):
            if not callable(model):
                raise WorkloadError(f"Task model must be an nn.Module or a factory of one, got {type(model).__name__}")
            try:
                model = model()
            except USER_CODE_ERRORS as exc:
                raise WorkloadError(f"Task model factory failed: {type(exc).__name__}: {exc}") from None
            if not isinstance(model, torch.nn.Module):
                raise WorkloadError(f"Task model factory returned {type(model).__name__}, not an nn.Module")
        self._materialize(model)
        try:
            moved = model.to()  # a no-op that returns the module, unless an override of to() forgets to return it
        except Exception:  # an override that wants a device or dtype (a probe only: the trials' to(device) tells)
            moved = model
        if not isinstance(moved, torch.nn.Module):
            raise WorkloadError(f"the model's to() returned {type(moved).__name__}, not the module: an override of to() must "
                                "return self (the trials and train.py move the model with model = model.to(device))")
        return model

    def _materialize(self, model: torch.nn.Module) -> None:
        """Give lazy modules' parameters (``nn.LazyLinear``, ``nn.LazyConv2d``) their shapes: one forward, in eval mode and
        without gradients, on the first two items. Left uninitialized, channels_last, DDP and an optimizer's state would
        meet parameters without a shape (``Attempted to use an uninitialized parameter``)."""
        import itertools

        import torch
        from torch.nn.parameter import is_lazy
        from torch.utils.data import IterableDataset

        if not any(is_lazy(t) for t in itertools.chain(model.parameters(), model.buffers())):
            return
        dataset = self.dataset
        read = None if isinstance(dataset, IterableDataset) else getattr(dataset, "__getitems__", None)
        source = iter(dataset) if isinstance(dataset, IterableDataset) else (dataset[i] for i in range(min(2, len(dataset))))
        modes = [(m, m.training) for m in model.modules()]  # each module's own: a frozen backbone's eval mode is kept
        model.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):  # the forward runs on the CPU: no CUDA device is touched
                # Read as a DataLoader reads it: through the dataset's own batched read where it has one.
                data = read(list(range(min(2, len(dataset))))) if callable(read) else list(itertools.islice(source, 2))
                self.compute_loss(model, self.collate(data))
        except WorkloadError:
            raise
        except USER_CODE_ERRORS as exc:
            raise WorkloadError(f"the first forward of the model's lazy modules failed: {type(exc).__name__}: {exc}") from None
        finally:
            for module, training in modes:
                module.training = training

    def lr_scaling(self, optimizer: torch.optim.Optimizer) -> str:
        """``"sqrt"`` for an adaptive (Adam-family, Adafactor, RMSprop, Adagrad) optimizer, ``"none"`` for one whose step
        does not follow the gradient's scale, ``"linear"`` otherwise.

        The square-root rule keeps adaptive optimizers' dynamics when the batch grows (Malladi et al. 2022); the linear
        rule is SGD's (Goyal et al. 2017). An optimizer of another library is adaptive when a class of its MRO is one of
        torch's adaptive ones or is named for Adam (``AdamW8bit``, ``FusedAdam``), LAMB or AdaBelief. Sign-based (Rprop,
        Lion, signSGD), orthogonalized (Muon), line-search (LBFGS) and parameter-free (Prodigy, D-Adaptation) ones keep
        the rate: ``lr`` itself sets their step's size. The nearest torch class in the MRO decides (a
        ``MillionStepSGD(SGD)`` is SGD); names decide only above ``Optimizer`` itself (``DAdaptAdam`` is no Adam).
        """
        for cls in type(optimizer).__mro__:
            if cls.__module__.startswith("torch.optim") and cls.__name__ != "Optimizer":
                return "none" if cls.__name__ in KEPT_RATE_OPTIMIZERS else "sqrt" if cls.__name__ in ADAPTIVE_OPTIMIZERS else "linear"
        names = [cls.__name__.lower() for cls in type(optimizer).__mro__]
        if any(part in name for name in names for part in KEPT_RATE_NAME_PARTS):
            return "none"
        return "sqrt" if any(part in name for name in names for part in ADAPTIVE_NAME_PARTS) else "linear"

    @functools.cached_property
    def _factory_takes_lr(self) -> bool:
        """Whether the optimizer factory is to be given ``lr=``: it takes that argument and does not set it itself.

        Decided once per Task: a ``**kwargs`` factory is built once over a dummy parameter to find out.

        A ``functools.partial`` that binds ``lr`` (``partial(torch.optim.SGD, lr=0.1, momentum=0.9)``) sets its own
        rate, as a factory without ``lr`` does: passing ``lr=`` would silently replace the rate the user wrote.
        A factory that takes ``**kwargs`` (``def make(params, **kwargs): return AdamW(params, **kwargs)``) takes
        ``lr=`` too: left out, the optimizer's own default rate would silently replace the Task's ``lr``; unless it sets
        ``lr`` itself beside them (``SGD(params, lr=0.1, **kwargs)``, see :func:`~autotune.workloads.optimizer_factory.passes_its_own_lr`).
        """
        import inspect

        if isinstance(self.optimizer, functools.partial) and "lr" in self.optimizer.keywords:
            return False
        try:
            parameters = inspect.signature(self.optimizer).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        if "lr" in parameters:
            return True
        keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        return keywords and self.optimizer is not None and not passes_its_own_lr(self.optimizer)

    def recipe_lr(self, optimizer: torch.optim.Optimizer) -> float:
        """The recipe's learning rate at ``batch_size``, given the optimizer built with ``lr=None``.

        ``lr``, unless the optimizer factory takes no ``lr``: its first param
        group's rate not at 0 is then the recipe's (the factory sets its own rates).

        Raises:
            WorkloadError: Such a factory sets every group's rate to 0.
        """
        if self.optimizer is None or self._factory_takes_lr:
            return float(self.lr)
        rate = first_rate(optimizer)
        if rate is None:
            raise WorkloadError("the Task's optimizer factory sets a learning rate of 0 in every param group: nothing would train")
        return rate

    def build_optimizer(
        self, params: Any, *, lr: float | None, cuda: bool, impl: str | None = None
    ) -> torch.optim.Optimizer:
        """The optimizer over ``params`` at learning rate ``lr`` (``impl`` applies to the default AdamW).

        The factory is given ``params`` as a list (``model.parameters()`` is a generator, which a factory that builds
        param groups by reading it twice would find spent the second time, leaving a group empty and untrained).

        A factory that takes no ``lr`` sets its own rates, and its first param
        group's not at 0 is the recipe's: each group's rate is multiplied by ``lr /
        that rate``, so the scaled rate applies and the factory's ratios
        between groups stay. ``lr=None`` leaves the recipe's rates.

        Raises:
            WorkloadError: The factory returns no ``torch.optim.Optimizer``, or one that holds none of ``params``.
        """
        import torch

        from autotune.torch_knobs import build_optimizer

        given = float(self.lr) if lr is None else lr
        params = list(params)  # a factory may read them twice (a group of weights, then one of biases): not a spent generator
        if self.optimizer is None:
            return build_optimizer(impl, params, lr=given)
        takes_lr = self._factory_takes_lr
        optimizer = self.optimizer(params, lr=given) if takes_lr else self.optimizer(params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise WorkloadError(f"Task optimizer factory returned {type(optimizer).__name__}, not a torch.optim.Optimizer")
        given_ids = {id(p) for p in params}
        if given_ids and not any(id(p) in given_ids for group in optimizer.param_groups for p in group["params"]):
            raise WorkloadError(f"the Task's optimizer factory returned a {type(optimizer).__name__} that holds none of the "
                                "parameters it was given (it builds it over another model's, a global one, say): every trial and "
                                "train.py would train nothing of the model; build it over the params the factory receives")
        if needs_closure(optimizer):
            raise WorkloadError(f"the Task's optimizer {type(optimizer).__name__} needs a closure in step() (as LBFGS does); the "
                                "trials and train.py call optimizer.step() after each step's backward, as for SGD or AdamW: "
                                "give the Task such an optimizer")
        if not takes_lr and lr is not None:
            base = first_rate(optimizer)
            if base is not None and lr != base:
                for group in optimizer.param_groups:
                    group["lr"] = group["lr"] * (lr / base)
        return optimizer

    # ------------------------------------------------------------- one batch
    def collate(self, data: Any) -> Any:
        """``data`` (items, or what the dataset's own ``__getitems__`` returned) as a DataLoader collates it: through
        ``collate_fn``, or PyTorch's default."""
        from torch.utils.data import default_collate

        return (self.collate_fn or default_collate)(data)

    def compute_loss(self, model: Any, batch: Any) -> Any:
        """The loss of one batch: ``step(model, batch)`` or ``loss(model(inputs), targets)``.

        Raises:
            WorkloadError: A ``loss`` workload whose batch is not an
                ``(inputs, targets)`` pair.
        """
        if self.step is not None:
            return self.step(model, batch)
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise self.not_pairs(type(batch).__name__)
        inputs, targets = batch
        output = model(inputs)
        criterion = self.criterion()
        _follow(criterion, output)
        return criterion(output, targets)

    def not_pairs(self, got: str) -> WorkloadError:
        """The refusal of a batch that is no ``(inputs, targets)`` pair for ``loss`` (or the default loss): ``got`` says what it is."""
        who = "a Task with loss=" if self.loss is not None else "the default loss (cross-entropy)"
        return WorkloadError(f"{who} needs (inputs, targets) batches, got {got}; give step=(model, batch) -> loss instead")

    def criterion(self) -> Callable[..., Any]:
        """``loss``, or cross-entropy by default."""
        if self.loss is not None:
            return self.loss
        import torch

        return torch.nn.functional.cross_entropy

    def samples_in(self, batch: Any) -> int:
        """Samples in a batch: ``batch_size_of(batch)``, else the first tensor's first dimension.

        Raises:
            WorkloadError: ``batch_size_of`` returned no integer (an integer
                0-d tensor, such as ``mask.sum()``, counts).
        """
        if self.batch_size_of is None:
            return first_dim(batch)
        import torch

        count: Any = self.batch_size_of(batch)
        if isinstance(count, torch.Tensor) and count.ndim == 0 and not count.is_floating_point():  # mask.sum()
            count = count.item()
        if isinstance(count, bool) or not isinstance(count, numbers.Integral):
            raise WorkloadError(f"batch_size_of(batch) returned {count!r} ({type(count).__name__}); it must return an int")
        return int(count)


def _refuse_tensor_columns(dataset: tuple[Any, ...] | dict[Any, Any]) -> None:
    """Refuse ``dataset=(inputs, targets)``: tensors of one length but different shapes, whose items would be the whole
    tensors (they cannot be stacked into a batch), where the ``TensorDataset`` of their rows was meant; and
    ``dataset={"x": inputs, "y": targets}``, whose item 0 is looked up as a key (``KeyError: 0``)."""
    import torch

    if isinstance(dataset, dict):
        if dataset and all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in dataset.values()) and 0 not in dataset:
            shapes = ", ".join(f"{key!r}: {describe_batch(t)}" for key, t in list(dataset.items())[:4])
            raise WorkloadError(f"Task dataset is a dict of tensors ({shapes}), whose items would be looked up by key (dataset[0]); "
                                "for the samples along their first dimension pass torch.utils.data.TensorDataset(*columns), or "
                                "a Dataset whose __getitem__ returns one sample's dict")
        return
    if len(dataset) < 2 or not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in dataset):
        return
    if len({t.shape[0] for t in dataset}) == 1 and len({t.shape for t in dataset}) > 1:
        shapes = ", ".join(describe_batch(t) for t in dataset)
        raise WorkloadError(f"Task dataset is a tuple of {len(dataset)} tensors ({shapes}), whose items are the whole tensors; "
                            f"for the {dataset[0].shape[0]} samples along their first dimension pass "
                            "torch.utils.data.TensorDataset(inputs, targets)")


def _follow(criterion: Callable[..., Any], output: Any) -> None:
    """Move a criterion module's own tensors (a class ``weight``, a ``pos_weight``) to the device of the model's output,
    as the model and the batches are moved: built on the CPU by the factory, they would not meet a GPU's output."""
    import torch

    if not isinstance(criterion, torch.nn.Module):
        return
    own = [*criterion.parameters(), *criterion.buffers()]
    if not own:  # nn.CrossEntropyLoss() without weights: nothing to move, and the output is not walked every step
        return
    devices = {t.device for t in tensors(output)}
    if len(devices) != 1:  # no tensor, or tensors on several devices (a CPU side output beside the logits): left as built
        return
    (device,) = devices
    if any(t.device != device for t in own):
        criterion.to(device)
