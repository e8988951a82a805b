"""TrainSetup: the knobs autotune tunes, and helpers to apply them.

A :class:`TrainSetup` is a plain, frozen dataclass. It validates itself,
round-trips through JSON without loss, and carries the few helpers a user's
own training loop needs to adopt a tuned setup::

    best = autotune.load_best("autotune-out/best.json")  # best.setup; best.lr, the rate for its batch
    setup = best.setup
    setup.configure_torch("cuda")          # threads, cuDNN autotuning, TF32
    loader = setup.dataloader(dataset, shuffle=True)
    model = setup.compile_model(setup.prepare_model(model))  # channels_last; torch.compile, when tuned on
    optimizer = setup.optimizer(model.parameters(), lr=best.lr)  # AdamW, tuned kernel
    images, labels = setup.to_device((images, labels), "cuda")
    with setup.autocast("cuda"):
        loss = criterion(model(images), labels)

The trial runner uses the very same helpers, so what was measured is what the
user runs.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autotune._version import __version__
from autotune.errors import SetupError
from autotune.nested import as_channels_last, map_tensors, to_device
from autotune.setup_checks import AMP_MODES as AMP_MODES  # re-exported: users and modules read it here
from autotune.setup_checks import check_move_device, check_setup_device, helper_device_type, helper_module, missing_knob, python_numbers, validate_setup
from autotune.torch_knobs import build_optimizer, compile_model, configure_torch, optimizer_kwargs

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch
    from torch.utils.data import DataLoader, Dataset

AmpMode = Literal["off", "bf16", "fp16"]
CompileMode = Literal["off", "default", "max-autotune-no-cudagraphs", "reduce-overhead"]
OptimizerImpl = Literal["for-loop", "foreach", "fused"]
Decode = Literal["cpu", "gpu"]

#: The knobs, in the order they are shown to users.
KNOBS: tuple[str, ...] = (
    "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "batch_size", "accumulation_steps", "amp", "channels_last",
    "num_threads", "compile", "cudnn_benchmark", "tf32", "optimizer_impl", "decode", "bucket_cap_mb", "gradient_as_bucket_view",
    "static_graph",
)
#: The knobs of DistributedDataParallel: searched only when a trial has more than one rank.
DDP_KNOBS: tuple[str, ...] = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")


@dataclass(frozen=True)
class TrainSetup:
    """One training setup: the DataLoader, batch and precision knobs.

    Attributes:
        num_workers: DataLoader worker processes (0 loads in the main process).
        prefetch_factor: Batches each worker loads ahead; ``None`` when
            ``num_workers`` is 0 (PyTorch rejects it there).
        pin_memory: Page-locked host buffers for faster host-to-GPU copies.
        persistent_workers: Keep workers alive between epochs.
        batch_size: Micro-batch per device and step.
        accumulation_steps: Micro-batches per optimizer step.
        amp: Autocast precision: ``"off"`` (fp32), ``"bf16"`` or ``"fp16"``.
        channels_last: NHWC memory format for model and input.
        num_threads: Intra-op CPU threads of the training process
            (``torch.set_num_threads``); ``None``: torch's own choice.
        compile: ``torch.compile`` mode, ``"off"`` for eager.
        cudnn_benchmark: cuDNN picks the fastest convolution algorithms
            (CUDA, fixed input shapes).
        tf32: TF32 float32 matmuls and convolutions (CUDA, Ampere and newer);
            ``False`` leaves torch's defaults.
        optimizer_impl: ``"for-loop"``, ``"foreach"`` or ``"fused"``
            optimizer kernels; ``None``: torch's own choice.
        decode: ``"cpu"`` (JPEGs decoded by the loader) or ``"gpu"``
            (``torchvision.io.decode_jpeg`` on the CUDA device).
        bucket_cap_mb: DistributedDataParallel's gradient bucket size in MiB
            (PyTorch's default 25; used with more than one rank only).
        gradient_as_bucket_view: DDP gradients as views into its buckets.
        static_graph: DDP told the graph is the same every step.
    """

    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    batch_size: int = 32
    accumulation_steps: int = 1
    amp: AmpMode = "off"
    channels_last: bool = False
    num_threads: int | None = None
    compile: CompileMode = "off"
    cudnn_benchmark: bool = False
    tf32: bool = False
    optimizer_impl: OptimizerImpl | None = None
    decode: Decode = "cpu"
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    def __post_init__(self) -> None:
        python_numbers(self)
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Reject values and combinations that cannot run on any device.

        Raises:
            SetupError: With a one-line reason.
        """
        validate_setup(self)

    def check_device(
        self, device: str | torch.device, *, bf16_supported: bool | None = None, tf32_supported: bool | None = None
    ) -> None:
        """Reject knobs the given device cannot run (see :func:`autotune.setup_checks.check_setup_device`).

        Raises:
            SetupError: With a one-line reason.
        """
        check_setup_device(self, device, bf16_supported=bf16_supported, tf32_supported=tf32_supported)

    # --------------------------------------------------------------- derived
    def effective_batch(self, world_size: int = 1) -> int:
        """Samples per optimizer step: micro-batch x accumulation x world size.

        Raises:
            SetupError: ``world_size`` is not an integer >= 1.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise SetupError(f"world_size must be an integer >= 1, got {world_size!r}")
        return self.batch_size * self.accumulation_steps * world_size

    def replace(self, **changes: Any) -> TrainSetup:
        """A copy with some knobs changed (validated; an unknown knob is a SetupError naming it)."""
        return self.from_dict({**self.to_dict(), **changes})

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """The knobs as a JSON-ready dict (every knob, in :data:`KNOBS` order)."""
        return {name: getattr(self, name) for name in KNOBS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainSetup:
        """Build a setup from :meth:`to_dict` output.

        Raises:
            SetupError: On unknown keys or invalid values.
        """
        if not isinstance(data, dict):
            raise SetupError(f"a setup must be a JSON object, got {type(data).__name__}")
        unknown = sorted(map(str, set(data) - set(KNOBS)))  # a key that is no string ({1: 2}) garbled the join
        if unknown:
            raise SetupError(f"unknown setup keys: {', '.join(unknown)[:200]} (a typo, or a setup of a newer autotune than {__version__})")
        return cls(**data)

    def to_json(self) -> str:
        """The setup as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> TrainSetup:
        """Parse :meth:`to_json` output."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SetupError(f"setup is not valid JSON: {exc}") from None
        except RecursionError:
            raise SetupError("setup is not valid JSON: nested too deeply to parse") from None
        return cls.from_dict(data)

    def describe(self) -> str:
        """A short human-readable summary, e.g. ``bs=64x2 w=2/pf4/persist bf16 channels_last``."""
        parts = [f"bs={self.batch_size}" + (f"x{self.accumulation_steps}" if self.accumulation_steps > 1 else "")]
        if self.num_workers:
            parts.append(f"w={self.num_workers}/pf{self.prefetch_factor or 2}" + ("/persist" if self.persistent_workers else ""))
        else:
            parts.append("w=0")
        parts.append("fp32" if self.amp == "off" else self.amp)
        if self.channels_last:
            parts.append("channels_last")
        if self.pin_memory:
            parts.append("pinned")
        extras = {
            f"threads={self.num_threads}": self.num_threads is not None,
            f"compile={self.compile}": self.compile != "off",
            "cudnn_benchmark": self.cudnn_benchmark,
            "tf32": self.tf32,
            f"opt={self.optimizer_impl}": self.optimizer_impl is not None,
            "gpu_decode": self.decode == "gpu",
        }
        parts.extend(text for text, on in extras.items() if on)
        if self.ddp_kwargs() != TrainSetup().ddp_kwargs():
            parts.append(
                f"ddp/bucket{self.bucket_cap_mb}" + ("/view" if self.gradient_as_bucket_view else "")
                + ("/static" if self.static_graph else "")
            )
        return " ".join(parts)

    # ------------------------------------------------- helpers for own loops
    def dataloader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keyword arguments this setup implies."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs

    def dataloader(self, dataset: Dataset[Any], **overrides: Any) -> DataLoader[Any]:
        """A ``torch.utils.data.DataLoader`` over ``dataset`` with the tuned knobs.

        Args:
            dataset: Any map-style or iterable dataset.
            **overrides: Extra or replacing DataLoader arguments (``shuffle=True``, ``sampler=...``, ``drop_last=True``, ...).
                ``num_workers=0`` drops the tuned prefetch and persistence (PyTorch refuses them without workers); a
                ``batch_sampler`` replaces the tuned ``batch_size``.
        """
        from torch.utils.data import DataLoader

        kwargs = self.dataloader_kwargs()
        kwargs.update(overrides)
        if not kwargs.get("num_workers"):
            for name in ("prefetch_factor", "persistent_workers"):
                if name not in overrides:
                    kwargs.pop(name, None)
        if kwargs.get("batch_sampler") is not None and "batch_size" not in overrides:
            kwargs.pop("batch_size", None)
        if kwargs.get("num_workers"):  # forked workers share this process's pymp-* folder (removed at its exit), not one each
            multiprocessing.util.get_temp_dir()
        loader = DataLoader(dataset, **kwargs)
        with contextlib.suppress(TypeError):  # an iterable dataset has no length to tell
            if kwargs.get("drop_last") and len(loader) == 0:  # a best.json tuned on more data: an epoch trained nothing, silently
                warnings.warn(f"this DataLoader yields no batch: its {len(loader.sampler)} items per epoch are fewer than batch_size "
                              f"{kwargs.get('batch_size')} with drop_last=True; pass a smaller batch_size= or drop_last=False", stacklevel=2)
        return loader

    def ddp_kwargs(self) -> dict[str, Any]:
        """The DistributedDataParallel keyword arguments this setup implies."""
        return {
            "bucket_cap_mb": self.bucket_cap_mb,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            "static_graph": self.static_graph,
        }

    def wrap_ddp(self, model: torch.nn.Module, device: str | torch.device | None = None) -> torch.nn.Module:
        """``model`` wrapped in ``DistributedDataParallel`` with the tuned DDP knobs.

        Call it after ``torch.distributed.init_process_group`` and after
        moving the model to its device (and :meth:`prepare_model`).

        Args:
            model: The model, already on ``device``.
            device: This rank's device; a CUDA device becomes ``device_ids``.

        Raises:
            SetupError: No process group, ``model`` no ``torch.nn.Module``, ``device`` no CPU or CUDA device or one torch
                cannot use here.
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        helper_module(model, "wrap_ddp")
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise SetupError("TrainSetup.wrap_ddp needs a process group: call torch.distributed.init_process_group first")
        ids = [torch.device(device)] if device is not None and helper_device_type(device, "wrap_ddp") == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, **self.ddp_kwargs())

    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or ``None`` for fp32."""
        import torch

        return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.amp]

    def autocast(self, device: str | torch.device) -> contextlib.AbstractContextManager[Any]:
        """A ``torch.autocast`` context for the tuned precision (a no-op for fp32); SetupError: ``device`` is no CPU or CUDA
        device, a CUDA device torch cannot use here (torch would only warn and autocast nothing), or a CPU for fp16."""
        import torch

        kind = helper_device_type(device, "autocast", self.amp)
        dtype = self.amp_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=kind, dtype=dtype)

    def grad_scaler(self, device: str | torch.device) -> torch.amp.GradScaler | None:
        """A ``torch.amp.GradScaler`` for fp16, ``None`` otherwise (bf16 needs none); SetupError as for :meth:`autocast`."""
        import torch

        kind = helper_device_type(device, "grad_scaler", self.amp)
        if self.amp != "fp16":
            return None
        return torch.amp.GradScaler(kind)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Convert ``model`` to channels_last when the setup asks for it; SetupError: ``model`` is no ``torch.nn.Module``,
        or one channels_last cannot hold (a 5-D weight: Conv3d)."""
        import torch

        helper_module(model, "prepare_model")
        if self.channels_last:
            try:
                model = model.to(memory_format=torch.channels_last)
            except RuntimeError as exc:  # torch's "required rank 4 tensor to use channels_last format"; an OOM stays one
                if "channels_last format" not in str(exc):
                    raise
                raise SetupError(f"prepare_model: channels_last cannot convert this model ({exc}): use a setup with "
                                 "channels_last=false") from None
        return model

    def configure_torch(self, device: str | torch.device) -> None:
        """Check the setup against ``device`` (:meth:`check_device`), then apply ``num_threads``,
        ``cudnn_benchmark`` and ``tf32`` to this process (call once, before the model runs).

        Raises:
            SetupError: The setup cannot run on ``device`` (a GPU's best.json on a CPU: fp16,
                pinned memory; a CUDA device this machine lacks).
        """
        from autotune.setup_checks import native_cpu_bf16  # a refusal's fix then names amp='bf16' where native

        self.check_device(device, bf16_supported=native_cpu_bf16(device))
        configure_torch(device, num_threads=self.num_threads, cudnn_benchmark=self.cudnn_benchmark, tf32=self.tf32)

    def optimizer_kwargs(self) -> dict[str, Any]:
        """``foreach=``/``fused=`` for a ``torch.optim`` optimizer ({} for torch's own choice)."""
        return optimizer_kwargs(self.optimizer_impl)

    def optimizer(self, params: Any, *, lr: float, cls: type[torch.optim.Optimizer] | None = None, **kwargs: Any) -> torch.optim.Optimizer:
        """An optimizer (AdamW unless ``cls`` is given) with the tuned kernel implementation; ``kwargs`` go to it
        (a ``foreach=`` or ``fused=`` of yours replaces the tuned kernel).

        Raises:
            SetupError: ``cls`` has no such implementation (LBFGS takes no ``foreach``), or refuses the arguments
                (``lr="x"``, a negative ``lr``, an empty parameter list).
        """
        return build_optimizer(self.optimizer_impl, params, lr=lr, cls=cls, **kwargs)

    def compile_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``torch.compile(model)`` in the tuned mode (the model itself when compile is off); SetupError: ``model`` is not callable."""
        helper_module(model, "compile_model", callables=True)
        return compile_model(model, self.compile)

    def to_device(self, batch: Any, device: str | torch.device) -> Any:
        """``batch`` on ``device`` as the trials moved it: every tensor of a tensor, tuple, list, dict, namedtuple or
        dataclass (nested), non-blocking from pinned memory, 4-D floating ones in channels_last when the setup asks;
        an object with its own ``to`` method moves itself; other values (ids, strings) as they are."""
        check_move_device(device)  # SetupError for a device torch cannot name, or CUDA where there is none
        return to_device(batch, device, channels_last=self.channels_last)

    def prepare_batch(self, batch: Any) -> Any:
        """The batch (a tensor, or a tuple, list or dict of them, nested) with every 4-D floating tensor in channels_last
        when the setup asks for it; its structure and other tensors as they are."""
        return map_tensors(batch, as_channels_last) if self.channels_last else batch


#: The version of best.json this autotune writes and reads.
BEST_SCHEMA = 1


def load_setup(path: str | Path) -> TrainSetup:
    """Read a TrainSetup from ``best.json`` (or a bare setup JSON file).

    Args:
        path: A ``best.json`` written by ``autotune search``, or a file that
            holds only the setup object.

    Raises:
        SetupError: The file is missing, is not JSON, or holds no valid setup.
    """
    from autotune.files import read_json

    if not isinstance(path, (str, os.PathLike)):
        raise SetupError(f"load_setup takes the path of a best.json, got {type(path).__name__}")
    if not os.fspath(path):  # Path("") is the working directory: its best.json was read
        raise SetupError("load_setup takes the path of a best.json, got an empty path")
    file = Path(path)
    if file.is_dir():  # a search's output directory, as emit, report and status take it
        file = file / "best.json"
    data = read_json(file, SetupError)
    if isinstance(data, dict) and ("setup" in data or "schema" in data):
        if type(data.get("schema")) is not int or data["schema"] != BEST_SCHEMA:  # 1.0 and true are no schema 1
            raise SetupError(f"{file}: best.json has schema {data.get('schema')!r}; this autotune reads the integer schema {BEST_SCHEMA}")
        if not isinstance(data.get("setup"), dict):
            raise SetupError(f"{file}: best.json has no \"setup\" object")
        if (missing := missing_knob(data["setup"])) is not None:
            raise SetupError(f"{file}: best.json lacks the field 'setup.{missing}'")
        data = data["setup"]
    try:
        return TrainSetup.from_dict(data)
    except (SetupError, TypeError) as exc:
        raise SetupError(f"{file}: {exc}") from None
