"""Process-wide torch settings and optimizer/compile choices behind the TrainSetup knobs.

``num_threads``, ``cudnn_benchmark`` and ``tf32`` change global torch state;
``optimizer_impl`` picks the for-loop, foreach or fused kernel of an optimizer;
``compile`` wraps a model in ``torch.compile``. The functions take plain values,
so the trial process, :class:`~autotune.train_setup.TrainSetup`'s helpers and
tests share one implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.devices import device_type
from autotune.units import counted

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: ``torch.compile`` modes; ``off`` runs eagerly. ``reduce-overhead`` uses CUDA graphs (CUDA only).
COMPILE_MODES: tuple[str, ...] = ("off", "default", "max-autotune-no-cudagraphs", "reduce-overhead")
#: Optimizer implementations: one kernel per parameter, one per group of tensors, or one fused kernel.
OPTIMIZER_IMPLS: tuple[str, ...] = ("for-loop", "foreach", "fused")
#: Where JPEGs are decoded: in the loader's processes, or in batches on the GPU.
DECODES: tuple[str, ...] = ("cpu", "gpu")


def configure_torch(
    device: str | torch.device, *, num_threads: int | None, cudnn_benchmark: bool, tf32: bool
) -> None:
    """Apply the process-wide settings, the CUDA flags both ways.

    The CUDA flags are set on and off: a training module that turned TF32 or cuDNN autotuning on at
    import would otherwise keep them on in a trial whose setup has them off, measured under the
    wrong label. ``num_threads=None`` leaves torch's thread count as it is.

    Args:
        device: The training device (the CUDA flags apply only to ``cuda``).
        num_threads: Intra-op threads (``torch.set_num_threads``).
        cudnn_benchmark: ``torch.backends.cudnn.benchmark``.
        tf32: TF32 for float32 matmuls (``torch.set_float32_matmul_precision("high")``; off:
            ``"highest"``, torch's default) and convolutions (``torch.backends.cudnn.conv.fp32_precision``;
            ``allow_tf32`` on a torch older than 2.9; off: left as torch sets them, which is TF32).
    """
    import warnings

    import torch

    from probes.cpu import usable_cores

    if num_threads is not None:
        usable = usable_cores()  # the affinity mask capped by a container's CPU quota, as the search counts them
        if num_threads > usable:  # a best.json tuned on a larger machine: its threads would share these cores
            warnings.warn(f"num_threads={num_threads} is more than the {counted(usable, 'CPU core')} this process may use (a setup tuned "
                          "on another machine?): the threads share the cores, which slows the step; tune on this machine, "
                          "or pass setup.replace(num_threads=None) for torch's own count", stacklevel=3)
        torch.set_num_threads(num_threads)
    if device_type(device) != "cuda":
        return
    torch.backends.cudnn.benchmark = cudnn_benchmark
    # Matmuls through torch.set_float32_matmul_precision, not matmul.fp32_precision: once the
    # latter is set, torch.get_float32_matmul_precision() raises ("mix of the legacy and new
    # APIs"), and inductor's autotuning (compile=max-autotune-no-cudagraphs) calls it. The call
    # also resets a module's matmul.allow_tf32 or matmul.fp32_precision.
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    if tf32:
        if hasattr(torch.backends.cudnn, "conv"):  # the per-backend precision API, torch >= 2.9
            torch.backends.cudnn.conv.fp32_precision = "tf32"
        else:
            torch.backends.cudnn.allow_tf32 = True


def optimizer_kwargs(impl: str | None) -> dict[str, Any]:
    """The ``torch.optim`` keyword arguments of an implementation (``None``: torch's own choice)."""
    if impl is None:
        return {}
    return {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]


def build_optimizer(impl: str | None, params: Any, *, lr: float, cls: Any = None, **kwargs: Any) -> torch.optim.Optimizer:
    """An optimizer (AdamW unless ``cls`` is given) with the ``impl`` kernels, see :meth:`TrainSetup.optimizer`.

    A ``foreach=`` or ``fused=`` among ``kwargs`` is the caller's choice of kernel: it replaces the tuned one (given
    beside it, ``AdamW`` got ``foreach`` twice, or ``fused`` and ``foreach`` both true).

    Raises:
        SetupError: ``cls`` has no such implementation (LBFGS takes no ``foreach``), or refuses the arguments given.
    """
    import inspect

    import torch

    from autotune.errors import SetupError

    chosen = cls or torch.optim.AdamW
    tuned = {} if {"foreach", "fused"} & set(kwargs) else optimizer_kwargs(impl)
    missing = [k for k in tuned if k not in inspect.signature(chosen).parameters]
    if missing:
        raise SetupError(f"optimizer_impl={impl}: {chosen.__name__} takes no {missing[0]}= argument; "
                         "use setup.replace(optimizer_impl=None) for torch's own choice")
    try:
        optimizer: torch.optim.Optimizer = chosen(params, lr=lr, **tuned, **kwargs)
    except (TypeError, ValueError) as exc:  # lr="x", lr=-1, betas=(1, 2), an empty parameter list: the caller's values
        raise SetupError(f"optimizer: {chosen.__name__} refused its arguments: {type(exc).__name__}: {exc}") from None
    return optimizer


def fused_supported(device: str | torch.device) -> bool:
    """Whether the installed torch has fused optimizer kernels for this device type."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return device_type(device) in _get_fused_kernels_supported_devices()
    except ImportError:  # pragma: no cover - older or newer torch without the helper
        return device_type(device) == "cuda"


def compile_model(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """``torch.compile(model)`` in ``mode``; ``off`` returns the model unchanged.

    Compilation is lazy: it happens in the first forward and backward pass.
    """
    if mode == "off":
        return model
    import torch

    compiled: torch.nn.Module = torch.compile(model, mode=None if mode == "default" else mode)
    return compiled
