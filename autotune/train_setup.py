"""TrainSetup: the knobs autotune tunes, and helpers to apply them.

A :class:`TrainSetup` is a plain, frozen dataclass. It validates itself,
round-trips through JSON without loss, and carries the few helpers a user's
own training loop needs to adopt a tuned setup::

    setup = autotune.load_setup("autotune-out/best.json")
    loader = setup.dataloader(dataset, shuffle=True)
    model = setup.prepare_model(model)
    scaler = setup.grad_scaler("cuda")
    with setup.autocast("cuda"):
        loss = criterion(model(setup.prepare_batch(images)), labels)

The trial runner uses the very same helpers, so what was measured is what the
user runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autotune.devices import device_type
from autotune.errors import SetupError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch
    from torch.utils.data import DataLoader, Dataset

AmpMode = Literal["off", "bf16", "fp16"]
AMP_MODES: tuple[str, ...] = ("off", "bf16", "fp16")

#: The knobs, in the order they are shown to users.
KNOBS: tuple[str, ...] = (
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "persistent_workers",
    "batch_size",
    "accumulation_steps",
    "amp",
    "channels_last",
    "bucket_cap_mb",
    "gradient_as_bucket_view",
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
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Reject values and combinations that cannot run on any device.

        Raises:
            SetupError: With a one-line reason.
        """
        for name in ("num_workers", "batch_size", "accumulation_steps", "bucket_cap_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise SetupError(f"{name} must be an integer, got {value!r}")
        for name in ("pin_memory", "persistent_workers", "channels_last", "gradient_as_bucket_view", "static_graph"):
            if not isinstance(getattr(self, name), bool):
                raise SetupError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.num_workers < 0:
            raise SetupError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.batch_size < 1:
            raise SetupError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.accumulation_steps < 1:
            raise SetupError(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if self.bucket_cap_mb < 1:
            raise SetupError(f"bucket_cap_mb must be >= 1, got {self.bucket_cap_mb}")
        if self.static_graph and self.accumulation_steps > 1:
            raise SetupError("static_graph does not work with accumulation_steps > 1 (DDP's no_sync breaks its reducer)")
        if self.amp not in AMP_MODES:
            raise SetupError(f"amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
        if self.num_workers == 0:
            if self.prefetch_factor is not None:
                raise SetupError("prefetch_factor needs num_workers > 0 (PyTorch rejects it with 0 workers)")
            if self.persistent_workers:
                raise SetupError("persistent_workers needs num_workers > 0")
        elif self.prefetch_factor is not None:
            if isinstance(self.prefetch_factor, bool) or not isinstance(self.prefetch_factor, int):
                raise SetupError(f"prefetch_factor must be an integer, got {self.prefetch_factor!r}")
            if self.prefetch_factor < 1:
                raise SetupError(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")

    def check_device(self, device: str | torch.device, *, bf16_supported: bool | None = None) -> None:
        """Reject knobs the given device cannot run.

        Args:
            device: ``"cpu"``, ``"cuda"`` or ``"cuda:K"``.
            bf16_supported: Whether the device runs bf16 natively. ``None``
                asks torch (for CUDA) or allows it (CPU autocast always runs).

        Raises:
            SetupError: fp16 on a CPU, bf16 on a GPU without it, pinned memory
                without a GPU.
        """
        kind = device_type(device)
        if kind == "cpu":
            if self.amp == "fp16":
                raise SetupError("amp=fp16 needs a CUDA device; on a CPU use amp=bf16 or amp=off")
            if self.pin_memory:
                raise SetupError("pin_memory only helps host-to-GPU copies; it needs a CUDA device")
            if bf16_supported is False and self.amp == "bf16":
                raise SetupError("amp=bf16: this CPU has no native bf16 (AMX / AVX512-BF16)")
        elif kind == "cuda":
            if self.amp == "bf16":
                if bf16_supported is None:
                    import torch

                    bf16_supported = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
                if not bf16_supported:
                    raise SetupError("amp=bf16: this GPU does not support bf16; use amp=fp16")
        else:
            raise SetupError(f"unsupported device {str(device)!r}; use cpu, cuda or cuda:K")

    # --------------------------------------------------------------- derived
    def effective_batch(self, world_size: int = 1) -> int:
        """Samples per optimizer step: micro-batch x accumulation x world size."""
        return self.batch_size * self.accumulation_steps * world_size

    def replace(self, **changes: Any) -> TrainSetup:
        """A copy with some knobs changed (validated)."""
        return dataclasses.replace(self, **changes)

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
        unknown = sorted(set(data) - set(KNOBS))
        if unknown:
            raise SetupError(f"unknown setup keys: {', '.join(unknown)}")
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
        return cls.from_dict(data)

    def describe(self) -> str:
        """A short human-readable summary, e.g. ``bs=64x2 w=2/pf4 bf16 cl``."""
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
        if self.ddp_kwargs() != TrainSetup().ddp_kwargs():
            parts.append(
                f"ddp/bucket{self.bucket_cap_mb}" + ("/view" if self.gradient_as_bucket_view else "")
                + ("/static" if self.static_graph else "")
            )
        return " ".join(parts)

    # ------------------------------------------------- helpers for own loops
    def dataloader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keyword arguments this setup implies."""
        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
        }
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs

    def dataloader(self, dataset: Dataset[Any], **overrides: Any) -> DataLoader[Any]:
        """A ``torch.utils.data.DataLoader`` over ``dataset`` with the tuned knobs.

        Args:
            dataset: Any map-style or iterable dataset.
            **overrides: Extra or replacing DataLoader arguments
                (``shuffle=True``, ``sampler=...``, ``drop_last=True``, ...).
        """
        from torch.utils.data import DataLoader

        kwargs = self.dataloader_kwargs()
        kwargs.update(overrides)
        return DataLoader(dataset, **kwargs)

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
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(device)] if device is not None and device_type(device) == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, **self.ddp_kwargs())

    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or ``None`` for fp32."""
        import torch

        return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.amp]

    def autocast(self, device: str | torch.device) -> contextlib.AbstractContextManager[Any]:
        """A ``torch.autocast`` context for the tuned precision (a no-op for fp32)."""
        import torch

        dtype = self.amp_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type(device), dtype=dtype)

    def grad_scaler(self, device: str | torch.device) -> torch.amp.GradScaler | None:
        """A ``torch.amp.GradScaler`` for fp16, ``None`` otherwise (bf16 needs none)."""
        import torch

        if self.amp != "fp16":
            return None
        return torch.amp.GradScaler(device_type(device))

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Convert ``model`` to channels_last when the setup asks for it."""
        import torch

        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def prepare_batch(self, images: torch.Tensor) -> torch.Tensor:
        """Convert a 4-D image batch to channels_last when the setup asks for it."""
        import torch

        if self.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return images


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

    file = Path(path)
    data = read_json(file, SetupError)
    if isinstance(data, dict) and "setup" in data:
        if data.get("schema") != BEST_SCHEMA:
            raise SetupError(f"{file}: best.json has schema {data.get('schema')!r}; this autotune reads {BEST_SCHEMA}")
        data = data["setup"]
    try:
        return TrainSetup.from_dict(data)
    except SetupError as exc:
        raise SetupError(f"{file}: {exc}") from None
    except TypeError as exc:
        raise SetupError(f"{file}: {exc}") from None
